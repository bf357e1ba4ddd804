"""The CUDA-graph runner's host logic on the CPU: static buffers refreshed in place, padded
batch sizes (padding rows with slot -1 and length 0), several graph sizes in one run, page-table
width changes. A stand-in "graph" re-runs the captured step on replay, so the tokens must equal
the eager engine's exactly (fp32, greedy). The capture itself is GPU-tier
(tests/serve/test_cuda_graphs.py)."""
from __future__ import annotations

import torch

import serve.cuda_graph as cg
from serve.engine import Engine, SamplingParams


class _ReplayByRerun:
    def __init__(self, step, out):
        self.step, self.out, self.replays = step, out, 0

    def replay(self):
        self.out.copy_(self.step())
        self.replays += 1


def _fake_capture(step, pool):
    out = step()
    return _ReplayByRerun(step, out), out


def _generate(engine, batch, seed):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(5, 400, (int(n),), generator=g).tolist()
               for n in torch.randint(1, 90, (batch,), generator=g)]
    outs = engine.generate(prompts, SamplingParams(max_tokens=20, temperature=0.0,
                                                   ignore_eos=True))
    return [o.token_ids for o in outs]


def test_graph_runner_logic_matches_eager(monkeypatch):
    kw = dict(device="cpu", dtype="float32", max_num_seqs=12, max_model_len=256,
              num_kv_pages=256, page_size=8)
    eager = Engine("dummy:tiny-llama", **kw)
    graphed = Engine("dummy:tiny-llama", **kw)
    monkeypatch.setattr(cg, "_capture", _fake_capture)
    monkeypatch.setattr(cg, "_pool", lambda: None)
    monkeypatch.setattr(cg, "_sync", lambda dev: None)
    graphs = cg.CudaGraphs(graphed.runner, 12)
    assert graphs.sizes == [1, 2, 4, 8, 12]
    graphed.runner.graphs = graphs
    for batch, seed in ((1, 0), (3, 1), (12, 2), (5, 3)):  # exact, padded, full, padded again
        assert _generate(graphed, batch, seed) == _generate(eager, batch, seed), batch
    used = {bs: g.replays for bs, (g, _, _) in graphs.graphs.items()}
    assert used[1] and used[4] and used[12] and used[8], used  # 1, 3->4, 12, 5->8
