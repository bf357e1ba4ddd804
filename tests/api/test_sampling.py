"""Public sampling ops: equal to tskernels_ref on CPU, scalars broadcast, bad input named."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tskernels
import tskernels_ref.sampling as ref

from ._helpers import assert_reference_selected, assert_same

sampling = tskernels.sampling


def params(b: int, gen: torch.Generator) -> dict:
    return dict(temperature=torch.rand(b, generator=gen) * 1.5,
                top_k=torch.randint(-1, 12, (b,), generator=gen, dtype=torch.int32),
                top_p=torch.rand(b, generator=gen) * 0.9 + 0.1,
                min_p=torch.rand(b, generator=gen) * 0.2,
                seeds=torch.randint(0, 2**62, (b,), generator=gen),
                steps=torch.randint(0, 1000, (b,), generator=gen))


@given(b=st.integers(1, 6), v=st.integers(1, 60), n=st.integers(0, 3),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), seed=st.integers(0, 2**31 - 1))
def test_sample_equals_reference(b, v, n, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(b, v, generator=gen) * 3).to(dtype)
    p = params(b, gen)
    n = min(n, v)
    assert_same(sampling.sample(logits, **p, num_logprobs=n),
                ref.sample(logits, **p, num_logprobs=n))
    assert_same(sampling.greedy(logits), ref.greedy(logits))


def test_scalars_broadcast_to_every_request():
    logits = torch.randn(4, 50)
    got = sampling.sample(logits, temperature=0.7, top_k=10, top_p=0.9, min_p=0.05, seeds=123,
                          steps=4, num_logprobs=2)
    full = lambda x, dt: torch.full((4,), x, dtype=dt)  # noqa: E731
    want = ref.sample(logits, temperature=full(0.7, torch.float32),
                      top_k=full(10, torch.int32), top_p=full(0.9, torch.float32),
                      min_p=full(0.05, torch.float32), seeds=full(123, torch.int64),
                      steps=full(4, torch.int64), num_logprobs=2)
    assert_same(got, want)


def test_greedy_rows_at_temperature_zero():
    logits = torch.randn(3, 20)
    out = sampling.sample(logits, temperature=0, top_k=0, top_p=1.0, min_p=0.0,
                          seeds=torch.arange(3))
    assert torch.equal(out.token_ids, logits.argmax(-1))
    assert out.top_logprobs is None


@pytest.mark.parametrize("op", ["sample", "greedy"])
def test_reference_selected_on_cpu(op):
    assert_reference_selected("sampling", op, formats={"logits": "bf16"})


LOGITS = torch.randn(2, 10)
OK = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seeds=0)


def bad(**kw):
    args = dict(OK)
    args.update(kw)
    logits = args.pop("logits", LOGITS)
    return lambda: sampling.sample(logits, **args)


BAD = [
    (bad(logits=LOGITS[0]), ValueError, "logits: expected 2 dim"),
    (bad(logits=LOGITS.long()), TypeError, "logits: expected dtype"),
    (bad(logits=LOGITS[:, :0]), ValueError, "logits: the vocabulary dimension is empty"),
    (bad(temperature=-0.5), ValueError, "temperature: expected >= 0"),
    (bad(temperature=float("nan")), ValueError, "temperature: expected >= 0"),
    (bad(temperature=torch.tensor([1.0, -1.0])), ValueError,
     "temperature: expected every value >= 0"),
    (bad(temperature=torch.ones(3)), ValueError, "temperature: expected shape"),
    (bad(temperature=torch.ones(2, dtype=torch.float64)), TypeError, "temperature: expected dtype"),
    (bad(temperature=torch.ones(2, device="meta")), ValueError,
     "temperature: expected a tensor on"),
    (bad(temperature="hot"), TypeError, "temperature: expected a"),
    (bad(top_k=2.5), TypeError, "top_k: expected a"),
    (bad(top_k=torch.ones(2)), TypeError, "top_k: expected dtype"),
    (bad(top_p=0.0), ValueError, r"top_p: expected in \(0, 1\]"),
    (bad(top_p=1.5), ValueError, r"top_p: expected in \(0, 1\]"),
    (bad(top_p=torch.tensor([0.5, 0.0])), ValueError, "top_p: expected every value in"),
    (bad(min_p=-0.1), ValueError, r"min_p: expected in \[0, 1\]"),
    (bad(min_p=torch.tensor([0.5, 1.5])), ValueError, "min_p: expected every value in"),
    (bad(seeds=torch.zeros(2, dtype=torch.int32)), TypeError, "seeds: expected dtype int64"),
    (bad(seeds=1.0), TypeError, "seeds: expected a"),
    (bad(steps=torch.zeros(3, dtype=torch.int64)), ValueError, "steps: expected shape"),
    (bad(num_logprobs=11), ValueError, r"num_logprobs: expected an int in \[0, 10\]"),
    (bad(num_logprobs=-1), ValueError, "num_logprobs"),
    (lambda: sampling.greedy(LOGITS[0]), ValueError, "logits: expected 2 dim"),
    (lambda: sampling.greedy(LOGITS.int()), TypeError, "logits: expected dtype"),
]


@pytest.mark.parametrize("call,exc,match", BAD)
def test_bad_input_names_the_argument(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def penalty_problem(b: int, v: int, gen: torch.Generator) -> tuple[torch.Tensor, dict]:
    ids = lambda n: torch.randint(-1, v + 1, (b, n), generator=gen)  # noqa: E731
    return (torch.randn(b, v, generator=gen) * 3,
            dict(output_ids=ids(12), output_lens=torch.randint(0, 13, (b,), generator=gen),
                 prompt_ids=ids(9).int(), prompt_lens=torch.randint(0, 10, (b,),
                                                                    generator=gen).int(),
                 repetition_penalty=torch.rand(b, generator=gen) + 0.5,
                 presence_penalty=torch.randn(b, generator=gen),
                 frequency_penalty=torch.randn(b, generator=gen),
                 logit_bias_ids=ids(3), logit_bias_values=torch.randn(b, 3, generator=gen)))


@given(b=st.integers(1, 5), v=st.integers(1, 50), seed=st.integers(0, 2**31 - 1),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
def test_apply_penalties_in_place_equals_reference(b, v, seed, dtype):
    gen = torch.Generator().manual_seed(seed)
    logits, kw = penalty_problem(b, v, gen)
    logits = logits.to(dtype)
    want = ref.apply_penalties(logits, **kw)
    got = logits.clone()
    assert sampling.apply_penalties(got, **kw) is got
    assert_same(got, want)


def test_apply_penalties_scalars_and_nothing_to_do():
    gen = torch.Generator().manual_seed(3)
    logits, kw = penalty_problem(3, 20, gen)
    scal = dict(kw, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=-0.25)
    full = {k: torch.full((3,), scal[k]) for k in ("repetition_penalty", "presence_penalty",
                                                  "frequency_penalty")}
    assert_same(sampling.apply_penalties(logits.clone(), **scal),
                ref.apply_penalties(logits, **dict(kw, **full)))
    same = logits.clone()
    sampling.apply_penalties(same, presence_penalty=1.0, repetition_penalty=2.0)
    assert torch.equal(same, logits)


PEN_BAD = [
    (dict(logits=LOGITS.double()), TypeError, "logits: expected dtype"),
    (dict(output_ids=torch.zeros(3, 4, dtype=torch.long)), ValueError, "output_ids: expected shape"),
    (dict(output_ids=torch.zeros(2, 4)), TypeError, "output_ids: expected dtype"),
    (dict(output_lens=torch.zeros(2, dtype=torch.long)), ValueError,
     "output_lens: given without output_ids"),
    (dict(prompt_ids=torch.zeros(2, 4, dtype=torch.long), prompt_lens=torch.zeros(3).long()),
     ValueError, "prompt_lens: expected shape"),
    (dict(repetition_penalty=0.0), ValueError, "repetition_penalty: expected finite and > 0"),
    (dict(repetition_penalty=torch.tensor([1.0, -1.0])), ValueError,
     "repetition_penalty: expected every value"),
    (dict(presence_penalty=float("inf")), ValueError, "presence_penalty: expected finite"),
    (dict(frequency_penalty="x"), TypeError, "frequency_penalty: expected a"),
    (dict(frequency_penalty=torch.ones(2, dtype=torch.float64)), TypeError,
     "frequency_penalty: expected dtype"),
    (dict(logit_bias_ids=torch.zeros(2, 3, dtype=torch.long)), ValueError, "give both or neither"),
    (dict(logit_bias_ids=torch.zeros(2, 3, dtype=torch.long), logit_bias_values=torch.zeros(2, 2)),
     ValueError, "logit_bias_values: expected shape"),
]


@pytest.mark.parametrize("kw,exc,match", PEN_BAD)
def test_apply_penalties_bad_input_names_the_argument(kw, exc, match):
    kw = dict(kw)
    logits = kw.pop("logits", LOGITS.clone())
    with pytest.raises(exc, match=match):
        sampling.apply_penalties(logits, **kw)
