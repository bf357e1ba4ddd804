"""Tokenizers for `dummy:` models (random weights), whose configs name no tokenizer.

A dummy model whose vocabulary holds the default model's (SmolLM2, 49,152 tokens) uses that
tokenizer; a smaller one (the `tiny-*` configs: 512-1,024 tokens) gets a byte-level tokenizer
that fits it: ids 0-2 are `<unk>`, `<s>`, `</s>`, ids 3-258 the 256 byte values and the rest
`<extra_N>` placeholders, so any text encodes and every id the model can emit decodes (a
placeholder as its own name). Below 259 tokens nothing fits, and the text
API says so (token-id prompts still work through the Engine).
"""
from __future__ import annotations

SPECIALS = ("<unk>", "<s>", "</s>")
BYTE_VOCAB = len(SPECIALS) + 256
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def byte_tokenizer(vocab_size: int = BYTE_VOCAB):
    """A `PreTrainedTokenizerFast` of exactly `vocab_size` ids: 3 specials, 256 bytes, then
    placeholders; no merges (text encodes byte by byte)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda c: _byte_of(c))
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    vocab.update({c: len(SPECIALS) + i for i, c in enumerate(alphabet)})
    vocab.update({f"<extra_{i}>": i for i in range(BYTE_VOCAB, vocab_size)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _byte_of(ch: str) -> int:
    """The byte a ByteLevel alphabet character stands for (GPT-2's printable remapping)."""
    code = ord(ch)
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    if code in printable:
        return code
    others = [b for b in range(256) if b not in printable]
    return others[code - 256]


def tokenizer_for(vocab_size: int, default_loader):
    """The tokenizer a dummy model of `vocab_size` tokens uses; `default_loader()` returns the
    default model's. Raises ValueError when no tokenizer fits the vocabulary."""
    default = default_loader()
    if vocab_size >= len(default):
        return default
    if vocab_size >= BYTE_VOCAB:
        return byte_tokenizer(vocab_size)
    raise ValueError(f"model: vocab_size {vocab_size} is smaller than any tokenizer here "
                     f"(the byte-level one needs {BYTE_VOCAB}); a dummy model this small takes "
                     "token-id prompts only (Engine.add_request), not text")
