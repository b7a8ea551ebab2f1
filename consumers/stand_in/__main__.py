"""`python -m consumers.stand_in`: see consumers.stand_in.cli."""

from consumers.stand_in.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
