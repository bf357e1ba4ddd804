"""tskernels.CPUGraph: a step of C++ CPU kernels and torch ops recorded once and replayed on new
inputs equals running the step again (bitwise: the same kernels on the same shapes), for every
kernel entry the engine's CPU decode step uses; what a replay cannot repeat is refused."""
from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tskernels
from tskernels import cpu_graph
from tskernels.cpu_graph import CaptureError

pytestmark = pytest.mark.skipif(not cpu_graph.available(),
                                reason="tskernels._cpu extension not built")

CPU_KERNELS = tskernels.KernelPolicy({
    "gemm.mm": "cpu_stream", "gemm.int8w_mm": "cpu_stream", "gemm.q4w_mm": "cpu_stream",
    "norm": "cpu_native", "activation": "cpu_native", "rope": "cpu_native",
    "attention": "torch_cpu"})


def _problem(g, m, hidden, inter, heads, kv_heads, d, pages, page_size):
    """Weights, a paged cache and the step's input tensors (the ones a replay refreshes)."""
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    w = dict(norm=r(hidden), qkv=r((heads + 2 * kv_heads) * d, hidden) / hidden ** 0.5,
             o=r(hidden, heads * d) / (heads * d) ** 0.5, up=r(2 * inter, hidden),
             down=r(hidden, inter), head=r(300, hidden))
    w["q8"], w["s8"] = tskernels.gemm.quantize_int8_per_channel(w["up"])
    w["q4"] = tskernels.gemm.quantize_q4_groups(w["down"])
    cache = tskernels.rope.cos_sin_cache(512, d, 10000.0)
    k_cache = r(pages, page_size, kv_heads, d)
    v_cache = r(pages, page_size, kv_heads, d)
    inputs = dict(x=r(m, hidden), pos=torch.zeros(m, dtype=torch.int32),
                  slots=torch.zeros(m, dtype=torch.int64),
                  table=torch.zeros(m, 8, dtype=torch.int32),
                  lens=torch.zeros(m, dtype=torch.int32))
    return w, cache, k_cache, v_cache, inputs


def _set_inputs(g, inputs, pages, page_size):
    """New values in place: tokens, positions / lengths, permuted pages, slots inside them."""
    m = inputs["x"].shape[0]
    inputs["x"].copy_(torch.randn(inputs["x"].shape, generator=g))
    lens = torch.randint(1, 8 * page_size + 1, (m,), generator=g, dtype=torch.int32)
    inputs["lens"].copy_(lens)
    inputs["pos"].copy_(lens - 1)
    for b in range(m):
        perm = torch.randperm(pages - 1, generator=g)[:8].to(torch.int32) + 1
        inputs["table"][b].copy_(perm)
        last = int(lens[b]) - 1
        inputs["slots"][b] = int(perm[last // page_size]) * page_size + last % page_size


def _step(w, cache, k_cache, v_cache, inp, heads, kv_heads, d, act_int8):
    """One decode-layer-like step over every C++ entry: rmsnorm, fp32 GEMM, RoPE, K/V store,
    paged decode attention, fused add + rmsnorm, int8 GEMM, SiLU-and-mul, 4-bit GEMM, logits
    and their argmax (a torch op)."""
    x, m = inp["x"], inp["x"].shape[0]
    h = tskernels.norm.rmsnorm(x, w["norm"], 1e-6)
    qkv = tskernels.gemm.mm(h, w["qkv"])
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q, k = tskernels.rope.apply_rope(q.reshape(m, heads, d), k.reshape(m, kv_heads, d),
                                     inp["pos"], cache)
    v = v.reshape(m, kv_heads, d)
    tskernels.attention.store_kv(k, v, k_cache, v_cache, inp["slots"])
    plan = tskernels.attention.decode_plan(inp["table"], inp["lens"], num_q_heads=heads,
                                           k_cache=k_cache, q_dtype=torch.float32)
    o = plan.run(q, k_cache, v_cache)
    y = tskernels.gemm.mm(o.reshape(m, heads * d), w["o"])
    y, res = tskernels.norm.fused_add_rmsnorm(y, x, w["norm"], 1e-6)
    gu = tskernels.gemm.int8w_mm(y, w["q8"], w["s8"], act_int8=act_int8)
    a = tskernels.activation.silu_and_mul(gu)
    z = tskernels.gemm.q4w_mm(a, *w["q4"], act_int8=act_int8) + res
    logits = tskernels.gemm.mm(z, w["head"])
    return logits, torch.argmax(logits, dim=-1)


@settings(deadline=None)
@given(seed=st.integers(0, 2**31 - 1), m=st.sampled_from([1, 2, 5, 16]),
       act_int8=st.booleans(), replays=st.integers(1, 3))
def test_replay_equals_rerun(seed, m, act_int8, replays):
    g = torch.Generator().manual_seed(seed)
    heads, kv_heads, d, pages, ps = 4, 2, 32, 40, 4
    w, cache, kc, vc, inp = _problem(g, m, 64, 96, heads, kv_heads, d, pages, ps)
    _set_inputs(g, inp, pages, ps)
    args = (w, cache, kc, vc, inp, heads, kv_heads, d, act_int8)
    graph = tskernels.CPUGraph()
    with tskernels.use_backend(CPU_KERNELS), torch.inference_mode():
        with graph.capture():
            logits, ids = _step(*args)
        # every kernel call of the step was recorded: norm, 3 fp32 GEMMs, RoPE of q and of k,
        # the K and V stores, attention, add + norm, int8 GEMM, SiLU, 4-bit GEMM; the torch
        # ops between them (the residual add, the argmax) replay from Python
        assert graph.num_kernel_calls == 13
        assert graph.num_torch_ops >= 2
        for _ in range(replays):
            _set_inputs(g, inp, pages, ps)
            k0, v0 = kc.clone(), vc.clone()
            graph.replay()
            got = logits.clone(), ids.clone(), kc.clone(), vc.clone()
            kc.copy_(k0)
            vc.copy_(v0)
            want_logits, want_ids = _step(*args)
            assert torch.equal(got[0], want_logits)
            assert torch.equal(got[1], want_ids)
            assert torch.equal(got[2], kc) and torch.equal(got[3], vc)


def test_captured_tensors_outlive_the_capture():
    """Temporaries of the step are kept with the graph: memory allocated after the capture
    never lands where a replay writes."""
    x, w = torch.randn(3, 64), torch.ones(64)
    graph = tskernels.CPUGraph()
    with tskernels.use_backend(CPU_KERNELS):
        with graph.capture():
            out = tskernels.norm.rmsnorm(tskernels.norm.rmsnorm(x, w, 1e-6) * 3.0, w, 1e-6)
    later = [torch.full((3, 64), 7.0) for _ in range(64)]   # would reuse freed temporaries
    x.copy_(torch.randn(3, 64))
    graph.replay()
    assert all(bool((t == 7.0).all()) for t in later)
    with tskernels.use_backend(CPU_KERNELS):
        want = tskernels.norm.rmsnorm(tskernels.norm.rmsnorm(x, w, 1e-6) * 3.0, w, 1e-6)
    assert torch.equal(out, want)


def test_capture_refuses_host_values_and_leaves_no_capture_behind():
    x = torch.randn(4, 64)
    graph = tskernels.CPUGraph()
    with pytest.raises(CaptureError, match="host value"):
        with tskernels.use_backend(CPU_KERNELS), graph.capture():
            y = tskernels.norm.rmsnorm(x, torch.ones(64), 1e-6)
            if float(y.abs().max()) > 0:   # a branch on a value: refused
                y = y * 2
    assert graph.num_kernel_calls == 0
    with pytest.raises(RuntimeError, match="nothing captured"):
        graph.replay()
    # the thread is not capturing any more: a new capture starts cleanly
    g2 = tskernels.CPUGraph()
    with tskernels.use_backend(CPU_KERNELS), g2.capture():
        tskernels.norm.rmsnorm(x, torch.ones(64), 1e-6)
    assert g2.num_kernel_calls == 1
    with pytest.raises(CaptureError, match="already captured"):
        with g2.capture():
            pass


def test_capture_refuses_value_dependent_shapes():
    x = torch.tensor([3, 1, 3, 0])
    for step in (lambda: torch.unique(x), lambda: x.nonzero(), lambda: x[x > 1]):
        with pytest.raises(CaptureError, match="depends on tensor values"):
            with tskernels.CPUGraph().capture():
                step()
    graph = tskernels.CPUGraph()
    with graph.capture():   # integer indices: the shape is the index's
        out = torch.arange(6)[x]
    x.copy_(torch.tensor([5, 4, 0, 2]))
    graph.replay()
    assert out.tolist() == [5, 4, 0, 2]


def test_replay_rejects_a_changed_result_shape():
    x = torch.zeros(4)
    graph = tskernels.CPUGraph()
    with graph.capture():
        out = x * 2
    x.resize_(5).zero_()
    with pytest.raises(RuntimeError, match="shape"):
        graph.replay()
    assert out.shape == (4,)


def test_other_threads_calls_are_not_recorded():
    x, w = torch.randn(2, 64), torch.ones(64)
    graph = tskernels.CPUGraph()
    started = threading.Event()
    with tskernels.use_backend(CPU_KERNELS):
        with graph.capture():
            def other():
                with tskernels.use_backend(CPU_KERNELS):
                    tskernels.norm.rmsnorm(torch.randn(2, 64), w, 1e-6)
                started.set()
            t = threading.Thread(target=other)
            t.start()
            assert started.wait(30)
            t.join()
            tskernels.norm.rmsnorm(x, w, 1e-6)
    assert graph.num_kernel_calls == 1


def test_nested_capture_is_refused():
    a, b = tskernels.CPUGraph(), tskernels.CPUGraph()
    with a.capture():
        with pytest.raises(RuntimeError, match="already capturing"):
            with b.capture():
                pass
