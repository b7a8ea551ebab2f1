"""`python -m consumers.ai_service`: see consumers.ai_service.cli."""

from consumers.ai_service.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
