"""GPU tier: a decode step replayed from a CUDA graph computes the logits the eager forward
computes for the same plan (and their argmax as its greedy ids), for batch sizes that hit an
exact graph, a padded graph and several graphs in one run (the graphs' plans and split-KV
workspaces must outlive the capture loop); and the same with an fp8 KV cache on a head-dim-128
model, where decode attention is the CUDA kernel (attention.decode.cuda) inside the graphs."""
from __future__ import annotations

import pytest
import torch

from tskernels.numerics import assert_close

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def engine():
    from serve.engine import Engine

    eng = Engine("dummy:tiny-llama", device="cuda", dtype="bfloat16", max_num_seqs=24,
                 max_model_len=512, num_kv_pages=512, page_size=16)
    assert eng.runner.graphs is not None, "CUDA graph capture failed (see the log)"
    return eng


def _llama_d128(tmp_path_factory, kv_heads, **engine_kw):
    """A 2-layer llama-shaped dummy model with head dim 128 (1024 / 8 heads) on the GPU."""
    import json

    from serve.engine import Engine

    cfg = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=1024,
               intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8,
               num_key_value_heads=kv_heads, vocab_size=512, rms_norm_eps=1e-5,
               hidden_act="silu", bos_token_id=1, eos_token_id=2, max_position_embeddings=4096)
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_text(json.dumps(cfg))
    return Engine(f"dummy:{path}", device="cuda", dtype="bfloat16", page_size=16,
                  num_kv_pages=512, **engine_kw)


@pytest.fixture(scope="module")
def engine_fp8(tmp_path_factory):
    # 8 KV heads: the CUDA fp8 decode's traits, auto-selected from 8 requests (64 request x
    # KV-head pairs) up
    eng = _llama_d128(tmp_path_factory, 8, max_num_seqs=12, max_model_len=512,
                      kv_cache_dtype="fp8_e4m3")
    assert eng.runner.graphs is not None, "CUDA graph capture failed (see the log)"
    return eng


@pytest.mark.parametrize("batch", [1, 3, 16, 21])
def test_graph_replay_matches_eager_forward(engine, batch):
    _check_graphs(engine, batch)


@pytest.mark.parametrize("batch", [1, 8, 11])
def test_graph_replay_fp8_cache(engine_fp8, batch):
    """fp8 KV: below 64 (request, KV head) pairs the Triton fp8 decode runs in the graphs,
    from 64 up the CUDA one (attention.decode.cuda); both against the eager forward."""
    import tskernels
    traits = {"head_dim": 128, "page_size": 16, "gqa": 1, "softcap": False,
              "sliding_window": False, "sinks": False}
    fmts = {"q": "bf16", "kv": "fp8_e4m3:per_tensor"}
    want = "cuda" if batch * 8 >= 64 else "triton"
    k = tskernels.select("attention", "decode", device="cuda", formats=fmts,
                         traits={**traits, "kv_programs": batch * 8})
    assert k.backend == want, k.name
    _check_graphs(engine_fp8, batch)


def _check_graphs(engine, batch):
    from serve.engine import SamplingParams

    runner, graphs = engine.runner, engine.runner.graphs
    replay = graphs.run
    checked = []

    def run_and_compare(plan):
        out = replay(plan)
        if out is not None:
            logits, ids = (t.clone() for t in out)
            eager = runner.model.compute_logits(runner.forward(*runner.step_meta(plan)))
            assert_close(logits, eager, torch.bfloat16, name=f"graph logits, {len(ids)} rows")
            assert torch.equal(ids.long(), logits.argmax(-1)), "graph's greedy ids"
            checked.append(len(ids))
        return out

    graphs.run = run_and_compare
    try:
        g = torch.Generator().manual_seed(batch)
        prompts = [torch.randint(5, 400, (int(n),), generator=g).tolist()
                   for n in torch.randint(1, 300, (batch,), generator=g)]
        outs = engine.generate(prompts, SamplingParams(max_tokens=24, temperature=0.0,
                                                       ignore_eos=True, detokenize=False))
    finally:
        graphs.run = replay
    assert [len(o.token_ids) for o in outs] == [24] * batch
    assert checked and max(checked) == batch  # decode steps went through the graphs


@pytest.fixture(scope="module")
def engine_d128(tmp_path_factory):
    # 2 KV heads (GQA 4), bf16 cache: new requests' prefill is attention.extend.cuda on sm_90;
    # prefix caching off so that a second run of the same prompts prefills from scratch too
    return _llama_d128(tmp_path_factory, 2, max_num_seqs=8, max_model_len=1024,
                       enable_prefix_caching=False)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="the CUDA prefill kernel is sm_90a only")
def test_prefill_with_cuda_extend_matches_triton(engine_d128, monkeypatch):
    """The engine's prefill runs the CUDA prefill kernel (selected for new requests) and gives
    the tokens and logprobs the Triton extend gives for the same prompts."""
    import tskernels
    from serve.engine import SamplingParams
    from tskernels.ops.attention import cuda_extend

    calls = []
    real = cuda_extend.CudaExtendPlan.run
    monkeypatch.setattr(cuda_extend.CudaExtendPlan, "run",
                        lambda self, *a, **kw: calls.append(1) or real(self, *a, **kw))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 500, (n,), generator=g).tolist() for n in (1, 77, 300, 129, 700)]
    sp = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, detokenize=False,
                        logprobs=0)
    outs = engine_d128.generate(prompts, sp)
    assert calls, "the prefill did not run attention.extend.cuda"
    n_cuda = len(calls)
    with tskernels.use_backend({"attention.extend": "triton"}):
        ref = engine_d128.generate(prompts, sp)
    assert len(calls) == n_cuda, "attention.extend.cuda ran under the Triton override"
    for a, b in zip(outs, ref):
        assert a.token_ids == b.token_ids
        assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), torch.bfloat16,
                     name="first tokens' logprobs, CUDA vs Triton prefill")


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="the CUDA prefill kernels are sm_90a only")
def test_prefix_extend_with_cuda_paged_matches_triton(tmp_path_factory, monkeypatch):
    """Prefix-cache hits and chunked prefill (new tokens over cached pages) run the paged CUDA
    kernel. Every CUDA extend call the engine makes is checked in place against the Triton
    extend on the same q / caches, and the engine's first tokens and logprobs against an
    engine that runs the Triton extend throughout (same seed, same weights; later tokens are
    not compared: rounding differences in the cache may flip a near-tie of the dummy model)."""
    import tskernels
    from serve.engine import SamplingParams
    from tskernels.ops.attention import cuda_extend

    calls = []
    real = cuda_extend.CudaExtendPlan.run

    def checked(self, q, kc, vc, **kw):
        o = real(self, q, kc, vc, **kw)
        ref = tskernels.attention.extend_plan(
            self.qo_indptr, self.page_table, self.seq_lens, num_q_heads=self.hq, k_cache=kc, q_dtype=q.dtype,
            backend="triton").run(q, kc, vc, k=kw.get("k"), v=kw.get("v"))
        assert_close(o, ref, q.dtype, name=f"engine's CUDA extend (paged={self.paged}) vs Triton")
        calls.append(self.paged)
        return o

    monkeypatch.setattr(cuda_extend.CudaExtendPlan, "run", checked)
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(5, 500, (400,), generator=g).tolist()
    first = [shared + torch.randint(5, 500, (37,), generator=g).tolist()]
    # a second turn over the shared prefix (cache hit), and a 700-token prompt that the
    # 256-token budget splits into chunks, each over the pages of the chunks before it
    rest = [shared + torch.randint(5, 500, (n,), generator=g).tolist() for n in (1, 90, 300)]
    rest.append(torch.randint(5, 500, (700,), generator=g).tolist())
    sp = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, detokenize=False,
                        logprobs=0)

    def run():
        eng = _llama_d128(tmp_path_factory, 2, max_num_seqs=8, max_model_len=1024,
                          chunked_prefill_size=256)
        return eng.generate(first, sp) + eng.generate(rest, sp)

    outs = run()
    assert True in calls, "no prefix batch ran attention.extend.cuda_paged"
    n = len(calls)
    with tskernels.use_backend({"attention.extend": "triton"}):
        ref = run()
    assert len(calls) == n, "a CUDA extend ran under the Triton override"
    for a, b in zip(outs, ref, strict=True):
        print("cuda", a.token_ids, a.logprobs, "triton", b.token_ids, b.logprobs)
    for a, b in zip(outs, ref, strict=True):
        assert a.token_ids[0] == b.token_ids[0]
        assert_close(torch.tensor(a.logprobs[:1]), torch.tensor(b.logprobs[:1]), torch.bfloat16,
                     name="first token's logprob, CUDA paged vs Triton extend")


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="the CUDA MLA decode is sm_90a only")
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_e4m3"])
def test_mla_decode_with_cuda_kernel_in_graphs(tmp_path_factory, monkeypatch, kv_cache_dtype):
    """A DeepSeek-V3-shaped dummy (64 heads, 512 + 64 latents, page 64; bf16 or fp8 latents)
    decodes through the CUDA MLA kernel captured in the engine's CUDA graphs (the latent rows
    stored by the Triton store_mla, which does not sync): each replay is checked against the
    eager step, and every eager call of the kernel in place against the Triton MLA kernel on
    the same inputs."""
    import json

    import tskernels
    from serve.config import _TINY_DSV3
    from serve.engine import Engine
    from tskernels.ops.mla import cuda_decode

    calls = []
    real = cuda_decode.CudaMLADecodePlan.run

    def checked(self, q, cache, **kw):
        o = real(self, q, cache, **kw)
        if not torch.cuda.is_current_stream_capturing():
            ref = tskernels.mla.decode_plan(
                self.page_table, self.seq_lens, num_heads=self.H, kv_cache=cache,
                scale=self.scale, q_dtype=q.dtype, backend="triton").run(
                    q, cache, kv_scale=kw.get("kv_scale"))
            assert_close(o, ref, q.dtype, name="engine's CUDA MLA decode vs Triton")
            calls.append(q.shape[0])
        return o

    monkeypatch.setattr(cuda_decode.CudaMLADecodePlan, "run", checked)
    cfg = dict(_TINY_DSV3, num_attention_heads=64, num_key_value_heads=64,
               first_k_dense_replace=3)  # all layers dense: the test is about attention
    path = tmp_path_factory.mktemp("dsv3") / "config.json"
    path.write_text(json.dumps(cfg))
    eng = Engine(f"dummy:{path}", device="cuda", dtype="bfloat16", page_size=64,
                 num_kv_pages=256, max_num_seqs=8, max_model_len=1024,
                 kv_cache_dtype=kv_cache_dtype)
    assert eng.runner.graphs is not None, "CUDA graph capture failed (see the log)"
    states = [b.attention for _, _, b in eng.runner.graphs.graphs.values()]
    assert all(type(s.decode).__name__ == "CudaMLADecodePlan" for s in states), \
        [type(s.decode).__name__ for s in states]
    _check_graphs(eng, 5)
    assert calls, "no eager step ran the CUDA MLA decode"


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="the CUDA paged extend is sm_90a only")
def test_later_turn_kernel_built_at_engine_start(tmp_path_factory):
    """ModelRunner.warm_extend_plans: the engine builds the later turn's paged extend (split +
    GQA-packed cubin) at start; a later turn over a cached prefix then loads no new build."""
    from serve.engine import SamplingParams
    from tskernels.ops import cuda_driver

    eng = _llama_d128(tmp_path_factory, 2)   # 4096 positions: a 4080-token warm-up prefix
    builds = lambda: {k for k in cuda_driver._modules if "-DSPLIT" in k[3]}  # noqa: E731
    warmed = builds()
    assert any("-DPACK" in k[3] for k in warmed), warmed
    g = torch.Generator().manual_seed(1)
    first = torch.randint(5, 500, (3900,), generator=g).tolist()
    sp = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True, detokenize=False)
    eng.generate([first], sp)
    eng.add_request("later", first + torch.randint(5, 500, (16,), generator=g).tolist(), sp)
    cached, tokens = None, []
    while eng.has_unfinished():
        for o in eng.step():
            if o.request_id == "later" and o.new_token_ids:
                cached = o.cached_tokens if cached is None else cached
                tokens += o.new_token_ids
    assert cached >= 3800 and len(tokens) == 2
    assert builds() == warmed
