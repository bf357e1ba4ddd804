"""A backend override from the environment or a TOML file that names nothing registered is an
error naming the source and what exists, not a silent fall-back to the default choice."""
from __future__ import annotations

import pytest
import torch

import tskernels
from tskernels import config


@pytest.fixture(autouse=True)
def _fresh():
    config.reload()
    yield
    config.reload()


@pytest.mark.parametrize("spec, match", [
    ("norm=bogus", r"backend 'bogus' for 'norm' is not registered; expected one of \[.*'reference'"),
    ("nrom=reference", r"'nrom' is not a registered family or family.op"),
    ("norm.rmsnorn=reference", r"'norm.rmsnorn' is not a registered"),
    ("bogus", r"backend 'bogus' for '\*' is not registered"),
])
def test_unknown_names_in_env_are_errors(spec, match, monkeypatch):
    monkeypatch.setenv("TSKERNELS_BACKEND", spec)
    with pytest.raises(ValueError, match="TSKERNELS_BACKEND: " + match):
        tskernels.norm.rmsnorm(torch.ones(2, 8), torch.ones(8))


def test_unknown_backend_in_toml_is_an_error(monkeypatch, tmp_path):
    cfg = tmp_path / "k.toml"
    cfg.write_text('[backend]\n"attention.decode" = "tritn"\n')
    monkeypatch.setenv("TSKERNELS_CONFIG", str(cfg))
    with pytest.raises(ValueError, match=r"config file .*backend 'tritn' for 'attention.decode'"):
        tskernels.select("attention", "decode", device="cpu")


def test_known_names_still_work(monkeypatch):
    monkeypatch.setenv("TSKERNELS_BACKEND", "norm=reference,attention.decode=torch_cpu")
    x = torch.randn(3, 16)
    torch.testing.assert_close(tskernels.norm.rmsnorm(x, torch.ones(16)),
                               tskernels.norm.rmsnorm(x, torch.ones(16), backend="reference"))
