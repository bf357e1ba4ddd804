"""Start-up progress bars (serve.weights.progress_bar): weight loading counts the checkpoint's
tensor bytes, drawn on a terminal, off when stderr is not one or TSKERNELS_PROGRESS says so;
the GGUF conversion draws the same bar over its tensors."""
from __future__ import annotations

import io

import pytest
import torch
from safetensors.torch import save_file

from serve import weights


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def ckpt(tmp_path):
    # 1000 + 2000 bytes of tensor data in two files
    save_file({"a": torch.zeros(250, dtype=torch.float32)}, str(tmp_path / "m-1.safetensors"))
    save_file({"b": torch.ones(10, 50, dtype=torch.float16),
               "c": torch.ones(500, dtype=torch.float16)}, str(tmp_path / "m-2.safetensors"))
    return tmp_path


@pytest.fixture
def drawn(monkeypatch):
    monkeypatch.delenv(weights.PROGRESS_ENV, raising=False)
    monkeypatch.setattr(weights, "PROGRESS_MININTERVAL_S", 0.0)   # draw every update


def _load(path, stream) -> dict:
    return {name: t.clone() for name, t in weights.checkpoint_tensors(str(path), progress_file=stream)}


def test_bar_counts_tensor_bytes_on_a_tty(ckpt, drawn):
    assert [weights._tensor_bytes(str(f)) for f in sorted(ckpt.glob("*.safetensors"))] == [1000, 2000]
    tty = _Tty()
    tensors = _load(ckpt, tty)
    assert sorted(tensors) == ["a", "b", "c"] and tensors["b"].shape == (10, 50)
    out = tty.getvalue()
    assert "Loading weights (2 files)" in out
    assert "0.00/3.00k " in out and "33%|" in out and "1.00k/3.00k " in out and "2.00k/3.00k " in out
    assert "100%|" in out and "3.00k/3.00k " in out and "B/s" in out


@pytest.mark.parametrize("env,tty,shown", [(None, False, False), ("0", True, False),
                                           ("off", True, False), ("1", False, True),
                                           ("auto", True, True)])
def test_bar_off_unless_a_tty_or_asked(ckpt, drawn, monkeypatch, env, tty, shown):
    if env is not None:
        monkeypatch.setenv(weights.PROGRESS_ENV, env)
    stream = _Tty() if tty else io.StringIO()
    assert len(_load(ckpt, stream)) == 3
    assert ("Loading weights" in stream.getvalue()) == shown


def test_bad_progress_setting_is_named(monkeypatch):
    monkeypatch.setenv(weights.PROGRESS_ENV, "sometimes")
    with pytest.raises(ValueError, match="TSKERNELS_PROGRESS"):
        weights.progress_enabled(_Tty())


def test_bar_over_an_iterable(drawn):   # the GGUF conversion's form
    tty = _Tty()
    assert list(weights.progress_bar(range(4), desc="GGUF -> safetensors", unit="tensor",
                                     file=tty)) == [0, 1, 2, 3]
    assert "GGUF -> safetensors: 100%" in tty.getvalue() and "4/4" in tty.getvalue()
