"""PySpark jobs: each a pure DataFrame transformation plus a thin `main`."""
