"""Our Tokenizer -> llguidance.LLTokenizer (the token trie masks are computed over).

Built from each token's raw bytes (byte-level BPE and SentencePiece byte fallback alike), so GGUF
and tokenizer.json models go through the same path; special tokens are marked so that text
grammars never produce them. Takes ~0.1 s for a 49k vocabulary: build once per engine."""
from __future__ import annotations

import llguidance


class _Vocabulary:
    """What llguidance.TokenizerWrapper reads: token bytes, special and end-of-sequence ids, encode."""

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self.tokens = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
        self.special_token_ids = sorted(tokenizer.special_token_ids)
        self.bos_token_id = tokenizer.bos_token_id
        self.eos_token_id = tokenizer.eos_token_id
        self._special = frozenset(tokenizer.special_token_ids)

    def __call__(self, text) -> list[int]:
        """Token ids of `text` as plain text. llguidance tokenizes the bytes a grammar forces with
        this; our encode() turns a special token's literal ('<|im_end|>', '<filename>') into the
        special token, which the grammar then rejects (a choice or const holding one was aborted),
        so such a literal is spelled with ordinary tokens."""
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        out = []
        for t in self._tok.encode(text, add_special_tokens=False):
            literal = self._tok.token_bytes(t).decode("utf-8", errors="replace")
            if t in self._special and len(literal) > 1:
                out += self(literal[:1]) + self(literal[1:])
            else:
                out.append(t)
        return out


def build_ll_tokenizer(tokenizer) -> llguidance.LLTokenizer:
    eos = sorted(tokenizer.eos_token_ids) or ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])
    if not eos:
        raise ValueError("structured_outputs: the tokenizer has no end-of-sequence token")
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocabulary(tokenizer)), eos_token=eos)
