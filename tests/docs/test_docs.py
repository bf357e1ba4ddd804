"""The docs stay true: every op signature in docs/OPS.md matches the code (names, order, kinds,
defaults), and every ```python block of the README and docs/*.md runs on the CPU (doctest
style: blocks of one file run in order in one namespace, so a later block may use an earlier
one's names). A block that must not run says so on its first line: `# not run: <reason>`."""
from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import tskernels

ROOT = Path(__file__).resolve().parents[2]
OPS = ROOT / "docs" / "OPS.md"
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ROW = re.compile(r"^\| `([a-z_]+)\.([a-z0-9_]+)` \| `\((.*?)\)(?: -> [^`]*)?` \|", re.M)
# every public op takes backend= (documented once in README "Registry and verification")
IMPLICIT = {"backend"}


def _documented(sig: str) -> list[tuple[str, str, object]]:
    """(name, kind, default) of each parameter of a documented `(a, b=1, *, c)` signature."""
    fn = ast.parse(f"def f({sig}): pass").body[0].args
    out = []
    pos = fn.posonlyargs + fn.args
    defaults = [None] * (len(pos) - len(fn.defaults)) + list(fn.defaults)
    for a, d in zip(pos, defaults):
        out.append((a.arg, "positional", _value(d)))
    for a, d in zip(fn.kwonlyargs, fn.kw_defaults):
        out.append((a.arg, "keyword", _value(d)))
    return out


_REQUIRED = object()


def _value(node):
    if node is None:
        return _REQUIRED
    text = ast.unparse(node)
    return text if text.startswith("torch.") else ast.literal_eval(node)


def _actual(fn) -> list[tuple[str, str, object]]:
    out = []
    for p in inspect.signature(fn).parameters.values():
        if p.name in IMPLICIT:
            continue
        kind = "keyword" if p.kind is p.KEYWORD_ONLY else "positional"
        d = _REQUIRED if p.default is p.empty else p.default
        out.append((p.name, kind, str(d) if str(d).startswith("torch.") else d))
    return out


ROWS = ROW.findall(OPS.read_text())


def test_ops_md_lists_ops():
    assert len(ROWS) >= 25, "the op table of docs/OPS.md was not found"


@pytest.mark.parametrize("family, op, sig", ROWS, ids=[f"{f}.{o}" for f, o, _ in ROWS])
def test_documented_signature_matches_code(family, op, sig):
    fn = getattr(getattr(tskernels, family), op, None)
    assert fn is not None, f"docs/OPS.md documents {family}.{op}, which does not exist"
    assert _documented(sig) == _actual(fn), (
        f"docs/OPS.md: {family}.{op}{sig!r} differs from the code's {inspect.signature(fn)}")


def test_every_public_op_is_documented():
    documented = {f"{f}.{o}" for f, o, _ in ROWS}
    missing = [f"{k.family}.{k.op}" for k in tskernels.kernels()
               if f"{k.family}.{k.op}" not in documented]
    assert not missing, f"ops missing from docs/OPS.md: {sorted(set(missing))}"


def _blocks(path: Path) -> list[tuple[int, str]]:
    text = path.read_text()
    return [(text[:m.start()].count("\n") + 1, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)]


DOCS_WITH_CODE = [p for p in DOC_FILES if _blocks(p)]


@pytest.mark.parametrize("path", DOCS_WITH_CODE, ids=[p.name for p in DOCS_WITH_CODE])
def test_python_blocks_run_on_cpu(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    namespace: dict = {"__name__": "__docs__"}
    for line, code in _blocks(path):
        if code.lstrip().startswith("# not run:"):
            continue
        try:
            exec(compile(code, f"{path.name}:{line}", "exec"), namespace)
        except Exception as e:  # noqa: BLE001 - report which block of which file broke
            raise AssertionError(f"{path.name}, the python block at line {line} fails on the "
                                 f"CPU: {type(e).__name__}: {e}") from e


SERVING = (ROOT / "docs" / "SERVING.md").read_text()
ENGINE_ROWS = re.findall(r"^\| `Engine\.([a-z_]+)` \| `\((.*?)\)(?: -> [^`]*)?` \|", SERVING, re.M)


@pytest.mark.parametrize("method, sig", ENGINE_ROWS, ids=[m for m, _ in ENGINE_ROWS])
def test_serving_engine_signatures_match(method, sig):
    from serve.engine import Engine
    fn = getattr(Engine, method)
    actual = [(n, k, "None" if d is None else d) for n, k, d in _actual(fn) if n != "self"]
    documented = [(n, k, "None" if d is None else d) for n, k, d in _documented(sig)]
    assert documented == actual, f"docs/SERVING.md: Engine.{method}({sig}) vs {inspect.signature(fn)}"


def test_serving_flags_exist():
    from serve.cli import build_parser
    known = {s for a in build_parser()._actions for s in a.option_strings}
    flags = set(re.findall(r"`(--[a-z][a-z0-9-]*)", SERVING))
    assert len(ENGINE_ROWS) >= 6 and len(flags) >= 20
    assert not flags - known, f"docs/SERVING.md names flags the CLI lacks: {sorted(flags - known)}"
    engine_flags = {o for a in build_parser()._action_groups if a.title == "engine"
                    for x in a._group_actions for o in x.option_strings}
    assert not engine_flags - flags, f"engine flags missing from docs/SERVING.md: {sorted(engine_flags - flags)}"
