"""CPU graphs (serve.cpu_graph): an engine whose decode steps replay recorded C++ kernel calls
produces exactly the eager engine's tokens and logprobs (the same kernels on the same shapes,
fp32), in every weight mode, through exact and padded batch sizes and seeded sampling; steps
the recorder cannot repeat (MoE routing) and batches above 16 rows decode eagerly."""
from __future__ import annotations

import pytest
import torch

from serve import cli
from serve.engine import Engine, SamplingParams
from tskernels import cpu_graph

pytestmark = pytest.mark.skipif(not cpu_graph.available(),
                                reason="tskernels._cpu extension not built")

KW = dict(device="cpu", dtype="float32", max_model_len=256, num_kv_pages=256, page_size=8,
          enable_prefix_caching=False)


def _prompts(batch, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(5, 400, (int(n),), generator=g).tolist()
            for n in torch.randint(1, 60, (batch,), generator=g)]


def _run(engine, batch, prompt_seed, **kw):
    kw = dict(dict(temperature=0.0), **kw)
    outs = engine.generate(_prompts(batch, prompt_seed),
                           SamplingParams(max_tokens=12, ignore_eos=True, **kw))
    return [(o.token_ids, o.logprobs) for o in outs]


@pytest.mark.parametrize("quantization", ["none", "int8", "int4"])
def test_cpu_graph_engine_matches_eager(quantization):
    eager = Engine("dummy:tiny-llama", **KW, max_num_seqs=12, quantization=quantization,
                   cpu_graphs=False)
    graphed = Engine("dummy:tiny-llama", **KW, max_num_seqs=12, quantization=quantization)
    assert eager.runner.graphs is None
    graphs = graphed.runner.graphs
    assert graphs is not None and graphs.sizes == [1, 2, 3, 4, 6, 8, 12]
    for batch, seed in ((1, 0), (3, 1), (5, 2), (12, 3)):   # exact, exact, padded 5->6, full
        assert _run(graphed, batch, seed) == _run(eager, batch, seed), batch
    sampled = dict(temperature=0.8, top_k=40, seed=5)
    assert _run(graphed, 4, 7, **sampled) == _run(eager, 4, 7, **sampled)
    got, want = _run(graphed, 2, 8, logprobs=3), _run(eager, 2, 8, logprobs=3)
    assert [t for t, _ in got] == [t for t, _ in want]
    for (_, a), (_, b) in zip(got, want):
        assert a == b
    used = {bs: g.replays - 1 for bs, (g, _, _) in graphs.graphs.items()}   # less the check
    assert all(used[bs] for bs in (1, 3, 4, 6, 12)), used
    assert all(g.num_kernel_calls > 0 for g, _, _ in graphs.graphs.values())


def test_rows_above_the_largest_graph_decode_eagerly():
    eager = Engine("dummy:tiny-llama", **KW, max_num_seqs=20, cpu_graphs=False)
    graphed = Engine("dummy:tiny-llama", **KW, max_num_seqs=20)
    graphs = graphed.runner.graphs
    assert graphs.sizes[-1] == 16
    before = graphs.graphs[16][0].replays   # (the start-up check replayed it once)
    assert _run(graphed, 20, 4) == _run(eager, 20, 4)
    assert graphs.graphs[16][0].replays == before   # 20 rows: no graph took them


def test_moe_routing_is_refused_and_decodes_eagerly():
    """The MoE block groups tokens by expert (value-dependent shapes): the capture refuses it,
    the engine still serves (eagerly) the same tokens."""
    moe = Engine("dummy:tiny-qwen3-moe", **KW, max_num_seqs=4)
    assert moe.runner.graphs is None
    ref = Engine("dummy:tiny-qwen3-moe", **KW, max_num_seqs=4, cpu_graphs=False)
    assert _run(moe, 2, 6) == _run(ref, 2, 6)


def test_cli_flag():
    parser = cli.build_parser()
    assert cli.engine_kwargs(parser.parse_args(["--no-cpu-graphs"]))["cpu_graphs"] is False
    assert "cpu_graphs" not in cli.engine_kwargs(parser.parse_args([]))


def test_a_step_reading_host_values_is_caught_by_the_start_up_check(monkeypatch, caplog):
    """A forward that reads tensor values behind the dispatcher's back (`.numpy()`) records a
    frozen constant; the start-up check (replay vs eager on other inputs) finds the difference
    and the runner decodes eagerly."""
    from serve.models import layers

    forward = layers.DecoderLayer.forward

    def peeking(self, x, residual, batch):
        x, residual = forward(self, x, residual, batch)
        return x + float(batch.positions.numpy().sum()) * 1e-3, residual

    monkeypatch.setattr(layers.DecoderLayer, "forward", peeking)
    with caplog.at_level("INFO", logger="serve.model_runner"):
        eng = Engine("dummy:tiny-llama", **KW, max_num_seqs=4)
    assert eng.runner.graphs is None
    assert "differs from the eager step" in caplog.text
