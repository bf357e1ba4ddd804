"""Engine / SamplingParams contract: bad input, abort, streaming, stats, logprobs, seeding."""
from __future__ import annotations

import math

import numpy as np
import pytest

from serve.engine import Engine, EngineArgs, RequestOutput, SamplingParams

PROMPT = [5, 9, 17, 33, 65, 129, 257, 300, 301, 302]


@pytest.fixture(scope="module")
def engine():
    return Engine("dummy:tiny-llama", device="cpu", num_kv_pages=64, page_size=4,
                  max_model_len=128, chunked_prefill_size=32)


def _drain(engine) -> list[RequestOutput]:
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    return outs


@pytest.mark.parametrize("field,value", [
    ("max_tokens", 0), ("max_tokens", -3), ("max_tokens", 1.5), ("max_tokens", "8"),
    ("max_tokens", 10 ** 9), ("temperature", -0.1), ("temperature", "hot"),
    ("temperature", float("nan")), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -2),
    ("top_k", 2.0), ("min_p", -0.1), ("min_p", 1.1), ("seed", "x"), ("seed", 1.0),
    ("stop_token_ids", "2"), ("stop_token_ids", [-1]), ("stop_token_ids", 5),
    ("ignore_eos", 1), ("detokenize", "no"), ("logprobs", -1), ("logprobs", 21), ("logprobs", True),
])
def test_sampling_params_rejects(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_sampling_params_accepts_edges():
    p = SamplingParams(max_tokens=1, temperature=0, top_p=1.0, top_k=-1, min_p=0.0, seed=0,
                       stop_token_ids=[3, 4], logprobs=0)
    assert p.stop_token_ids == (3, 4) and p.greedy
    assert SamplingParams(top_k=0, top_p=1e-3, logprobs=20, seed=2**63 - 1).top_k == 0


@pytest.mark.parametrize("seed", [2**63, 2**64 - 1, 2**70, -1])
def test_seed_outside_63_bits_is_refused(seed):
    # the sampler keys on 63-bit seeds: 2**63 used to sample exactly like seed 0
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(seed=seed)


def test_generate_without_detokenize(engine):
    """detokenize=False returns the same tokens and no text (no tokenizer needed)."""
    greedy = dict(max_tokens=6, temperature=0.0, ignore_eos=True)
    with_text = engine.generate(PROMPT, SamplingParams(**greedy))[0]
    ids_only = engine.generate(PROMPT, SamplingParams(**greedy, detokenize=False))[0]
    assert ids_only.token_ids == with_text.token_ids and len(ids_only.token_ids) == 6
    assert ids_only.text == "" and with_text.text != ""


@pytest.mark.parametrize("kwargs,exc", [
    (dict(page_size=3), ValueError), (dict(max_num_seqs=0), ValueError),
    (dict(kv_cache_dtype="int4"), ValueError), (dict(dtype="float64"), ValueError),
    (dict(gpu_memory_utilization=1.5), ValueError), (dict(device="tpu"), ValueError),
    (dict(max_model_len=-1), ValueError), (dict(bogus=1), TypeError),
])
def test_engine_args_rejects(kwargs, exc):
    with pytest.raises(exc):
        EngineArgs.from_kwargs(**kwargs)


def test_default_page_size():
    """Unset page_size: 64-row pages on a GPU (the CUDA MLA decode's, and the paged extend's
    faster size), 16 on the CPU for every model; an explicit size wins."""
    from types import SimpleNamespace

    from serve.config import default_page_size
    mla, gqa = SimpleNamespace(kv_lora_rank=512), SimpleNamespace(num_key_value_heads=8)
    assert default_page_size(mla, "cuda") == 64 and default_page_size(mla, "cuda:1") == 64
    assert default_page_size(mla, "cpu") == 16 and default_page_size(gqa, "cuda") == 64
    assert default_page_size(gqa, "cpu") == 16
    assert Engine("dummy:tiny-deepseek-v3", device="cpu", num_kv_pages=64).args.page_size == 16
    assert Engine("dummy:tiny-deepseek-v3", device="cpu", num_kv_pages=64,
                  page_size=32).args.page_size == 32


@pytest.mark.parametrize("model", ["dummy:no-such-config", "/no/such/dir", "dummy:/nope.json"])
def test_unknown_model(model):
    with pytest.raises(ValueError, match="model"):
        Engine(model, device="cpu")


def test_max_model_len_beyond_model(tmp_path):
    with pytest.raises(ValueError, match="max_model_len"):
        Engine("dummy:tiny-llama", device="cpu", max_model_len=10 ** 6)


@pytest.mark.parametrize("prompt,match", [
    ([], "empty"), ("hello", "list of ints"), ([1, 2, 512], r"\[0, 512\)"), ([1, -1], "token"),
    ([1, 2.5], "token"), (list(range(1, 129)), "max_model_len"), (None, "list of ints"),
    ([1, True], "True"), ([3, 2 ** 70], "token"), (np.array([1.0, 2.0]), "token"),
    (np.array([[1, 2]]), "token"), (np.array([], dtype=np.int64), "empty"),
])
def test_add_request_rejects_bad_prompt(engine, prompt, match):
    with pytest.raises(ValueError, match=match):
        engine.add_request("bad", prompt, SamplingParams())
    assert not engine.has_unfinished()


def test_prompt_as_numpy_or_numpy_ints_runs_like_a_list(engine):
    """The vectorised prompt check takes numpy arrays and numpy ints, with the same tokens."""
    greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    prompts = {"list": PROMPT, "array": np.array(PROMPT, dtype=np.int32),
               "np ints": [np.int64(t) for t in PROMPT]}
    for name, prompt in prompts.items():
        engine.add_request(name, prompt, greedy)
    toks: dict[str, list[int]] = {}
    for o in _drain(engine):
        toks.setdefault(o.request_id, []).extend(o.new_token_ids)
    assert len(toks["list"]) == 4 and toks["array"] == toks["list"] == toks["np ints"]


def test_prompt_check_gives_the_same_ids_for_every_input_kind(engine):
    """A list (the C++ conversion), a tuple, an array and numpy ints (numpy's) give one array."""
    want = np.array(PROMPT, dtype=np.int32)
    for prompt in (PROMPT, tuple(PROMPT), np.array(PROMPT), [np.int32(t) for t in PROMPT]):
        got = engine._check_prompt(prompt)
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, want)


def test_add_request_rejects_bad_id_and_params(engine):
    with pytest.raises(ValueError, match="request_id"):
        engine.add_request("", PROMPT, SamplingParams())
    with pytest.raises(ValueError, match="params"):
        engine.add_request("x", PROMPT, {"max_tokens": 3})
    engine.add_request("dup", PROMPT, SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="already"):
        engine.add_request("dup", PROMPT, SamplingParams(max_tokens=2))
    _drain(engine)


def test_abort_unknown_raises_keyerror(engine):
    with pytest.raises(KeyError):
        engine.abort("never-added")


def test_abort_frees_pages_and_reports(engine):
    engine.add_request("a", PROMPT, SamplingParams(max_tokens=50, ignore_eos=True))
    engine.add_request("b", PROMPT[:4], SamplingParams(max_tokens=3, ignore_eos=True))
    first = engine.step()
    assert {o.request_id for o in first} == {"a", "b"}
    assert engine.stats()["kv_pages_used"] > 0
    engine.abort("a")
    engine.abort("a")  # aborting twice before the next step is harmless
    outs = _drain(engine)
    a = [o for o in outs if o.request_id == "a"]
    assert a[-1].finished and a[-1].finish_reason == "abort" and a[-1].new_token_ids == []
    b = [o for o in outs if o.request_id == "b"]
    assert b[-1].finish_reason == "length" and b[-1].completion_tokens == 3
    assert engine.stats()["kv_pages_used"] == 0
    with pytest.raises(KeyError):
        engine.abort("a")  # finished requests are unknown


def test_step_outputs_and_stats(engine):
    engine.add_request("s", PROMPT, SamplingParams(max_tokens=5, ignore_eos=True))
    outs = _drain(engine)
    assert [len(o.new_token_ids) for o in outs] == [1] * 5
    assert [o.completion_tokens for o in outs] == [1, 2, 3, 4, 5]
    assert all(o.prompt_tokens == len(PROMPT) for o in outs)
    assert [o.finished for o in outs] == [False] * 4 + [True]
    assert outs[-1].finish_reason == "length" and outs[0].logprobs is None
    st = engine.stats()
    for key in ("running", "waiting", "kv_pages_total", "kv_pages_used", "kv_usage",
                "prefix_hit_rate", "prefix_hit_tokens", "prefix_query_tokens", "retractions",
                "num_generated_tokens"):
        assert key in st
    assert st["kv_pages_total"] == 64 and 0.0 <= st["kv_usage"] <= 1.0
    assert engine.step() == []


def test_stop_token_ids(engine):
    greedy = engine.generate([PROMPT], SamplingParams(max_tokens=8, temperature=0,
                                                      ignore_eos=True))[0].token_ids
    stop = greedy[3]
    out = engine.generate([PROMPT], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True,
                                                   stop_token_ids=[stop]))[0]
    assert out.token_ids == greedy[:greedy.index(stop) + 1] and out.finish_reason == "stop"


def test_stream_matches_generate(engine):
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    full = engine.generate([PROMPT], params)[0].token_ids
    chunks = list(engine.stream(PROMPT, params))
    assert [t for c in chunks for t in c.new_token_ids] == full
    assert chunks[-1].finished and not any(c.finished for c in chunks[:-1])


def test_stream_closed_early_aborts(engine):
    it = engine.stream(PROMPT, SamplingParams(max_tokens=40, ignore_eos=True))
    next(it)
    it.close()
    assert not engine.has_unfinished() and engine.stats()["kv_pages_used"] == 0


def test_logprobs(engine):
    out = engine.generate([PROMPT], SamplingParams(max_tokens=4, temperature=0, logprobs=3,
                                                   ignore_eos=True))[0]
    assert len(out.logprobs) == len(out.top_logprobs) == 4
    for tok, lp, top in zip(out.token_ids, out.logprobs, out.top_logprobs):
        assert len(top) == 3 and top[0][0] == tok and math.isclose(top[0][1], lp, rel_tol=1e-5)
        assert lp <= 0 and top[0][1] >= top[1][1] >= top[2][1]
    zero = engine.generate([PROMPT], SamplingParams(max_tokens=2, logprobs=0))[0]
    assert len(zero.logprobs) == 2 and zero.top_logprobs == [[], []]


def test_seeded_sampling_is_reproducible_and_batch_independent(engine):
    p = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, top_k=50, seed=1234,
                       ignore_eos=True)
    alone = engine.generate([PROMPT], p)[0].token_ids
    batched = engine.generate([PROMPT[:5], PROMPT, PROMPT[2:]],
                              [SamplingParams(max_tokens=5), p, SamplingParams(seed=7)])
    assert batched[1].token_ids == alone
    other = engine.generate([PROMPT], SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9,
                                                     top_k=50, seed=4321, ignore_eos=True))
    assert other[0].token_ids != alone


def test_generate_params_list_length(engine):
    with pytest.raises(ValueError, match="params"):
        engine.generate([PROMPT, PROMPT], [SamplingParams()])


@pytest.mark.parametrize("model", ["dummy:tiny-llama", "dummy:tiny-deepseek-v3"])
def test_fp8_kv_cache_runs_close_to_bf16_cache(model):
    """An fp8-e4m3 pool (unit scales) serves the same requests; with small random weights the
    quantized cache keeps the first greedy tokens."""
    outs = {}
    for kv in ("auto", "fp8_e4m3"):
        e = Engine(model, device="cpu", num_kv_pages=32, page_size=4, kv_cache_dtype=kv)
        assert e.runner.pool.fp8 == (kv == "fp8_e4m3")
        outs[kv] = e.generate([PROMPT], SamplingParams(max_tokens=4, temperature=0,
                                                       ignore_eos=True))[0].token_ids
        assert e.stats()["kv_pages_used"] == 0
    assert outs["fp8_e4m3"][:2] == outs["auto"][:2]


def test_bf16_engine_on_cpu():
    e = Engine("dummy:tiny-qwen3", device="cpu", dtype="bfloat16", num_kv_pages=32, page_size=4)
    assert e.model.layers[0].self_attn.qkv_proj.weight.dtype == e.runner.pool.k.dtype \
        == __import__("torch").bfloat16
    out = e.generate([PROMPT], SamplingParams(max_tokens=5, temperature=0, logprobs=2,
                                              ignore_eos=True))[0]
    assert len(out.token_ids) == 5 and all(lp <= 0 for lp in out.logprobs)


def test_mla_layers_must_share_one_plan(monkeypatch):
    """Every MLA layer runs the step's one decode / extend plan, built with the runner's softmax
    scale: a model whose layers disagree is refused at load, not served with layer 0's."""
    import itertools

    from serve.models import deepseek_v3

    scales = itertools.count(1)
    monkeypatch.setattr(deepseek_v3, "mla_softmax_scale", lambda cfg: 0.1 * next(scales))
    with pytest.raises(ValueError, match="MLA layers with different"):
        Engine("dummy:tiny-deepseek-v3", device="cpu", num_kv_pages=64)


def test_extend_warm_up_is_gpu_only(engine):
    """ModelRunner.warm_extend_plans builds nothing on a CPU runner (its GPU form:
    tests/serve/test_cuda_graphs.py::test_later_turn_kernel_built_at_engine_start)."""
    assert engine.runner.warm_extend_plans() is False
