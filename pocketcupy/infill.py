"""Fill-in-the-middle prompts (OpenAI completions' `suffix`, llama.cpp's /infill): the text before
the hole and the text after it between a code model's three marker tokens, in llama.cpp's order,
[BOS] PRE prefix SUF suffix MID, after which the model writes the middle."""
from __future__ import annotations

# (prefix, suffix, middle) marker tokens of code models, found by their text where a GGUF does not
# name them (tokenizer.ggml.fim_pre_token_id, ..._suf_..., ..._mid_...)
MARKERS = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),   # Qwen2.5-Coder, Qwen3-Coder
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),         # StarCoder, Granite code
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),       # DeepSeek-Coder
    ("▁<PRE>", "▁<SUF>", "▁<MID>"),                           # CodeLlama
)
_TEXTS = frozenset(t for triple in MARKERS for t in triple)


def find_markers(tokens: list[str]) -> tuple[int, int, int] | None:
    """The ids of the first MARKERS triple the vocabulary has whole, or None."""
    index = {t: i for i, t in enumerate(tokens) if t in _TEXTS}
    for triple in MARKERS:
        if all(t in index for t in triple):
            return tuple(index[t] for t in triple)
    return None


def infill_prompt(tokenizer, prefix_ids: list[int], suffix: str) -> list[int]:
    """The prompt ids of a completion between prefix_ids (the prompt's tokens, no special tokens
    added) and suffix; ValueError naming suffix for a model without marker tokens."""
    if tokenizer.fim_ids is None:
        raise ValueError("suffix: this model has no fill-in-the-middle tokens (a code model's prefix / suffix / "
                         "middle markers), so it cannot complete between a prompt and a suffix")
    pre, suf, mid = tokenizer.fim_ids
    bos = [tokenizer.bos_token_id] if tokenizer.add_bos else []
    return [*bos, pre, *prefix_ids, suf, *tokenizer.encode(suffix, add_special_tokens=False), mid]
