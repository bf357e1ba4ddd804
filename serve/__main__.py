"""`python -m serve [MODEL] ...`: see serve/cli.py."""
from serve.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
