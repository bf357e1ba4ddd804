"""python -m tskernels table        print the op x backend x verification table (README's)
python -m tskernels table --write   rewrite it in README.md between its markers"""
from __future__ import annotations

import sys
from pathlib import Path

from .registry import verification_table

START, END = "<!-- verification-table:start -->", "<!-- verification-table:end -->"


def readme_with_table(text: str) -> str:
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{verification_table()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "table":
        print(__doc__, file=sys.stderr)
        return 2
    if "--write" in argv:
        readme = Path(__file__).resolve().parents[1] / "README.md"
        readme.write_text(readme_with_table(readme.read_text()))
    else:
        print(verification_table())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
