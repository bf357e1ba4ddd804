"""README facts that must not drift from the code."""
from __future__ import annotations

import re
from pathlib import Path

from tskernels.__main__ import readme_with_table

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_verification_table_is_current():
    assert README == readme_with_table(README), \
        "README's verification table is stale: run `python -m tskernels table --write`"


def test_readme_opens_with_two_commands_and_ci_runs_the_second():
    blocks = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    assert len(blocks) >= 2
    install_serve, tests = blocks[0].strip(), blocks[1].strip()
    assert "python -m serve" in install_serve and "pytest" in tests
    assert README.index(blocks[0]) < 200, "the set-up commands must open the README"
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests in ci, ".ci/run must call the README's test command"
