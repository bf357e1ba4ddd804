"""autotune: spaces, search with an injected timer, the per-device store's precedence."""
from __future__ import annotations

import json

import pytest

from autotune import Space, Store, cpu_timer, search


def test_space_product_and_constraint():
    s = Space(a=[1, 2, 4], b=[1, 2], where=lambda c: c["a"] * c["b"] <= 4)
    got = list(s)
    assert {(c["a"], c["b"]) for c in got} == {(1, 1), (1, 2), (2, 1), (2, 2), (4, 1)}
    assert len(s) == 5 and len(s.sample(3)) == 3 and s.sample(3) == s.sample(3)
    with pytest.raises(ValueError, match="no choices"):
        Space(a=[])


def test_search_picks_fastest_and_records_failures():
    cost = {1: 30.0, 2: 10.0, 4: 20.0}

    def build(cfg):
        if cfg["w"] == 8:
            raise RuntimeError("out of shared memory")
        return lambda: cfg["w"]

    res = search(Space(w=[1, 2, 4, 8]), build, timer=lambda fn: cost[fn()])
    assert res.config == {"w": 2} and res.us == 10.0
    assert any("shared memory" in r.get("error", "") for r in res.table)
    with pytest.raises(RuntimeError, match="no config"):
        search(Space(w=[8]), build, timer=lambda fn: 1.0)


def test_search_check_rejects_wrong_results():
    res = search(Space(w=[1, 2]), lambda c: (lambda: None), timer=lambda fn: 1.0,
                 check=lambda c: c["w"] == 2)
    assert res.config == {"w": 2}


def test_cpu_timer_measures():
    assert cpu_timer(lambda: sum(range(1000)), iters=3) > 0


def test_store_precedence_and_persistence(tmp_path):
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "nvidia-h200.json").write_text(json.dumps({"k": {"N=1": {"w": 4}}}))
    store = Store(user_dir=tmp_path / "user", shipped_dir=shipped)
    assert store.get("k", "nvidia-h200", "N=1") == {"w": 4}                  # shipped
    assert store.get("k", "nvidia-h200", "N=2", fallback=lambda: {"w": 1}) == {"w": 1}
    assert store.get("k", "amd-mi300x", "N=1") is None
    path = store.put("k", "nvidia-h200", "N=1", {"w": 8})
    saved = json.loads(path.read_text())
    assert saved["format"] == 2 and saved["entries"][0]["config"] == {"w": 8}
    assert Store(user_dir=tmp_path / "user", shipped_dir=shipped).get(
        "k", "nvidia-h200", "N=1") == {"w": 8}                               # user beats shipped
    (shipped / "nvidia-b200.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        store.get("k", "nvidia-b200", "N=1")


def test_shipped_tables_are_valid_json():
    from autotune.cache import SHIPPED
    for p in SHIPPED.glob("*.json"):
        assert isinstance(json.loads(p.read_text()), dict), p
