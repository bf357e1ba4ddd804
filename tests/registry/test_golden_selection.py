"""Golden selection per target: every host checks what every public op would pick on every
platform we build for (injected, no hardware needed).

For each op with a problem generator (`tskernels.testing.conformance`), the problem as the
public op describes it (formats, traits) is decided on each target platform, by default and
with `allow_unverified=True`; the picks must equal tests/registry/golden_selection.json, and on
top of the golden file three rules hold everywhere: a compile-verified-only kernel is never
auto-selected, the explain() table names the winner as "selected", and every filtered
unverified candidate says "not run-verified".

When a registration changes on purpose: `TSKERNELS_UPDATE_GOLDEN=1 pytest
tests/registry/test_golden_selection.py` rewrites the file; review its diff.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import tskernels
from tskernels import registry
from tskernels.platform import Platform, amd_features, nvidia_features
from tskernels.testing.conformance import generators

GOLDEN = Path(__file__).with_name("golden_selection.json")
TARGETS = {
    "sm_80": Platform("nvidia", 80, "NVIDIA A100-SXM4-80GB", nvidia_features(80), 108),
    "sm_86": Platform("nvidia", 86, "NVIDIA RTX A6000", nvidia_features(86), 84),
    "sm_90": Platform("nvidia", 90, "NVIDIA H200", nvidia_features(90), 132),
    "sm_100": Platform("nvidia", 100, "NVIDIA B200", nvidia_features(100), 148),
    "sm_120": Platform("nvidia", 120, "NVIDIA RTX PRO 6000", nvidia_features(120), 188),
    "gfx942": Platform("amd", "gfx942", "AMD Instinct MI300X", amd_features("gfx942"), 304),
    "gfx950": Platform("amd", "gfx950", "AMD Instinct MI355X", amd_features("gfx950"), 256),
    "cpu": Platform("cpu", None, "cpu"),
}


def _problems() -> dict[str, dict]:
    """op name -> {formats, traits} of one bf16 problem (fp32 where bf16 is not generated)."""
    out = {}
    for (family, op), (gen_fn, dtypes) in sorted(generators().items()):
        dtype = torch.bfloat16 if torch.bfloat16 in dtypes else dtypes[0]
        case = gen_fn(torch.Generator().manual_seed(0), dtype, "small")
        out[f"{family}.{op}"] = {"formats": dict(case.formats),
                                 "traits": {k: v for k, v in case.traits.items()
                                            if isinstance(v, (int, str, bool, float))}}
    return out


def _decide(name: str, prob: dict, plat: Platform, allow: bool) -> tuple[str, list]:
    family, op = name.split(".")
    ov = registry.config.resolve(family, op, None, None, allow)
    try:
        chosen, report = registry._decide(family, op, plat, prob["formats"], prob["traits"], ov)
    except registry.SelectionError:
        return "none", []
    return chosen.backend, report


@pytest.fixture(scope="module")
def picks():
    old = {k: os.environ.pop(k) for k in ("TSKERNELS_BACKEND", "TSKERNELS_OBJECTIVE",
                                          "TSKERNELS_ALLOW_UNVERIFIED", "TSKERNELS_CONFIG")
           if k in os.environ}
    tskernels.kernels()                                 # import every family
    table, reports = {}, {}
    try:
        for name, prob in _problems().items():
            for target, plat in TARGETS.items():
                for allow in (False, True):
                    backend, report = _decide(name, prob, plat, allow)
                    table.setdefault(name, {}).setdefault(target, {})[
                        "allow_unverified" if allow else "default"] = backend
                    reports[name, target, allow] = report
    finally:
        os.environ.update(old)
    return table, reports


def test_golden_file_matches(picks):
    table, _ = picks
    if os.environ.get("TSKERNELS_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    assert GOLDEN.exists(), "no golden file: run with TSKERNELS_UPDATE_GOLDEN=1 once"
    golden = json.loads(GOLDEN.read_text())
    diff = [f"{op} on {t} ({mode}): golden {golden.get(op, {}).get(t, {}).get(mode)!r}, now {b!r}"
            for op, per in table.items() for t, modes in per.items() for mode, b in modes.items()
            if golden.get(op, {}).get(t, {}).get(mode) != b]
    diff += [f"{op}: in the golden file, no longer generated" for op in golden if op not in table]
    assert not diff, ("selection changed (TSKERNELS_UPDATE_GOLDEN=1 to accept, then review):\n"
                      + "\n".join(diff))


def test_unverified_kernels_are_never_auto_selected(picks):
    _, reports = picks
    by_backend = {(k.family, k.op, k.backend): k for k in tskernels.kernels()}
    for (name, target, allow), report in reports.items():
        if allow or not report or target == "cpu":
            continue
        winner = report[-1][0] if report[-1][1].startswith("selected") else next(
            k for k, why in report if why.startswith("selected"))
        spec = by_backend[(winner.family, winner.op, winner.backend)]
        assert spec.band == "reference" or target in spec.verification.run, (name, target, spec.backend)


def test_explain_names_winner_and_unverified_reasons(picks):
    table, reports = picks
    for (name, target, allow), report in reports.items():
        if not report:
            continue
        assert sum(why.startswith("selected") for _, why in report) == 1, (name, target, report)
        assert all(why.split(":", 1)[-1].strip() for _, why in report), report
        if allow:
            continue
        # the kernel that wins once unverified kernels are allowed was filtered, by default,
        # for exactly that reason
        other = table[name][target]["allow_unverified"]
        if other != table[name][target]["default"] and other != "none":
            row = next(why for k, why in report if k.backend == other)
            assert "not run-verified" in row, (name, target, row)


def test_compile_verified_blackwell_and_amd_picks_need_allow_unverified(picks):
    table, _ = picks
    for target in ("sm_100", "gfx942", "gfx950"):
        for name, per in table.items():
            default, allowed = per[target]["default"], per[target]["allow_unverified"]
            if default != allowed:
                assert default in ("reference", "none") or allowed != "reference", (name, target)
