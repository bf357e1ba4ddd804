"""dummy: models take text: a tokenizer that fits their vocabulary (every id decodes)."""
from __future__ import annotations

import pytest

from serve.dummy_tokenizer import BYTE_VOCAB, byte_tokenizer, tokenizer_for


def test_byte_tokenizer_round_trips_any_text_and_fits_the_vocab():
    tok = byte_tokenizer(512)
    assert len(tok) == 512 and tok.bos_token_id == 1 and tok.eos_token_id == 2
    text = "héllo, wörld ✓ \n\t"
    ids = tok(text)["input_ids"]
    assert ids[:5] == [3 + b for b in "héllo".encode()[:5]]
    assert all(3 <= i < BYTE_VOCAB for i in ids) and tok.decode(ids) == text
    assert tok.decode([3 + ord("a"), 400]) == "a<extra_400>"
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                     add_generation_prompt=True)
    assert prompt == "<|user|>\nhi\n<|assistant|>\n"


def test_tokenizer_for_picks_by_vocab_size():
    class Big:
        def __len__(self):
            return 49152
    big = Big()
    assert tokenizer_for(49152, lambda: big) is big
    assert len(tokenizer_for(1024, lambda: big)) == 1024
    with pytest.raises(ValueError, match="vocab_size 100 is smaller than any tokenizer"):
        tokenizer_for(100, lambda: big)


def test_tiny_dummy_engine_generates_text():
    from serve.engine import Engine, SamplingParams
    eng = Engine("dummy:tiny-llama", num_kv_pages=32)
    assert len(eng.tokenizer) == eng.hf_config.vocab_size == 512
    out = eng.generate(["Hello"], SamplingParams(max_tokens=4, temperature=0))[0]
    assert len(out.token_ids) == 4 and out.text == eng.tokenizer.decode(out.token_ids)
    assert out.text   # ids >= 259 decode as placeholders, never to nothing
