"""Lab helper: merge the records of a partial compile run (`python -m tskernels.compile
--kernels PREFIX --json F`) into tests/compile/resources.json: new (kernel, case, target) keys
are added and the named kernel-function's keys refreshed, every other record is kept (the full
`TSKERNELS_UPDATE_RESOURCES=1` rewrite needs the whole matrix, ~15 min on 2 cores).

    python benchmarks/merge_resources.py RECORDS.json [...] --refresh FUNCTION_NAME
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from tskernels.compile import SHARED_LIMIT

RES = Path(__file__).resolve().parents[1] / "tests" / "compile" / "resources.json"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("records", nargs="+")
    ap.add_argument("--refresh", default=None)
    a = ap.parse_args()
    doc = json.loads(RES.read_text())
    comment = doc.pop("_comment")
    added = refreshed = 0
    for f in a.records:
        for r in json.loads(Path(f).read_text()):
            if not r.get("ok"):
                continue
            key = f"{r['kernel']}|{r['case']}|{r['target']}"
            summ = {"registers": r["registers"], "spill_bytes": r["spill_bytes"] or 0,
                    "shared_bytes": r["shared_bytes"],
                    "fits": r["shared_bytes"] <= SHARED_LIMIT[r["target"]]}
            if key not in doc:
                added += 1
            elif a.refresh and a.refresh in r["case"]:
                refreshed += 1
            else:
                continue
            doc[key] = summ
    RES.write_text(json.dumps({"_comment": comment, **dict(sorted(doc.items()))}, indent=1)
                   + "\n")
    print(f"added {added}, refreshed {refreshed}")


if __name__ == "__main__":
    main()
