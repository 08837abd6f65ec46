"""vLLM's `bad_words`: words the output must not contain, as token sequences whose last token is
forbidden wherever the output ends with the others (a one-token word: always)."""
from __future__ import annotations

from collections.abc import Sequence


def bad_words_token_ids(tokenizer, words: Sequence[str]) -> tuple[tuple[int, ...], ...]:
    """Each word tokenized as written (left-stripped) and after a space, so that it is forbidden at
    the start of the text and inside it (vLLM's rule); duplicates dropped."""
    seqs: dict[tuple[int, ...], None] = {}
    for word in words:
        for prefix in ("", " "):
            try:
                ids = tuple(tokenizer.encode(prefix + word.lstrip(), add_special_tokens=False))
            except ValueError as e:  # (a lone surrogate): name the field
                raise ValueError(f"bad_words: {word!r}: {e}") from None
            if ids:
                seqs[ids] = None
    return tuple(seqs)


def banned_tokens(seqs: Sequence[tuple[int, ...]], output_ids: Sequence[int]) -> list[int]:
    """The tokens forbidden next after output_ids: the last token of each sequence whose other tokens
    end output_ids."""
    out = []
    for s in seqs:
        k = len(s) - 1
        if k == 0 or (len(output_ids) >= k and tuple(output_ids[-k:]) == s[:-1]):
            out.append(s[-1])
    return out
