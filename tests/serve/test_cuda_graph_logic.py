"""The CUDA-graph runner's host logic on the CPU: static buffers refreshed in place (one packed
upload), padded batch sizes (padding rows with slot -1 and length 0), several graph sizes in one run, page-table
width changes, greedy ids taken from the graph, sampled and logprob rows from its logits.
A stand-in "graph" re-runs the captured step on replay, so the tokens must equal
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
        with torch.inference_mode():   # a real replay needs no mode; a re-run does
            for dst, src in zip(self.out, self.step()):
                dst.copy_(src)
        self.replays += 1


def _fake_capture(step, pool):
    out = step()
    return _ReplayByRerun(step, out), out


def _generate(engine, batch, prompt_seed, **kw):
    g = torch.Generator().manual_seed(prompt_seed)
    prompts = [torch.randint(5, 400, (int(n),), generator=g).tolist()
               for n in torch.randint(1, 90, (batch,), generator=g)]
    kw = dict(dict(temperature=0.0), **kw)
    outs = engine.generate(prompts, SamplingParams(max_tokens=20, ignore_eos=True, **kw))
    return [(o.token_ids, o.logprobs) for o in outs]


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
    # seeded sampling with logprobs: from the graph's logits, same draws as the eager engine
    sampled = dict(temperature=0.8, top_k=50, logprobs=2)
    got, want = _generate(graphed, 3, 9, seed=7, **sampled), _generate(eager, 3, 9, seed=7, **sampled)
    assert [t for t, _ in got] == [t for t, _ in want]
    for (_, a), (_, b) in zip(got, want):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-5)
    used = {bs: g.replays for bs, (g, _, _) in graphs.graphs.items()}
    assert used[1] and used[4] and used[12] and used[8], used  # 1, 3->4, 12, 5->8
