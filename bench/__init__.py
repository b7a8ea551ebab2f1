"""Benchmarks: side-by-side comparisons in one run, figures printed and saved."""
