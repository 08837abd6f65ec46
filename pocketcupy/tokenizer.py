"""Text <-> token ids for GGUF and Hugging Face models, plus streaming detokenization.

Decoding works on each token's raw bytes (byte-level BPE bytes, SentencePiece byte fallback),
so partial UTF-8 sequences spread over tokens decode the same whether streamed or not.
"""
from __future__ import annotations

import codecs
from typing import Callable, Iterable

from .infill import find_markers
from .tokenizer_gguf import CONTROL, UNKNOWN, UNUSED, USER_DEFINED, build_from_gguf


class Tokenizer:
    def __init__(self, *, tokens: list[str], token_types: list[int], piece_bytes: list[bytes],
                 encode_text: Callable[[str], list[int]], bos_token_id: int | None,
                 eos_token_id: int | None, eos_token_ids: Iterable[int], add_bos: bool,
                 chat_template: str | None, strip_leading_space: bool = False,
                 tool_use_template: str | None = None, suffix_ids: Iterable[int] = (),
                 fim_ids: tuple[int, int, int] | None = None):
        self._tokens = tokens
        self._types = token_types
        self._pieces = piece_bytes
        self._encode_text = encode_text
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.add_bos = bool(add_bos) and bos_token_id is not None
        # what add_special_tokens appends: the EOS of tokenizers that end every text with it, as
        # embedding models' do (GGUF tokenizer.ggml.add_eos_token, a Hugging Face post-processor)
        self.suffix_ids = tuple(suffix_ids)
        # fill-in-the-middle marker tokens (prefix, suffix, middle) of code models (infill.py)
        self.fim_ids = tuple(fim_ids) if fim_ids is not None else find_markers(tokens)
        self.chat_template = chat_template
        # a model's named "tool_use" template, which transformers (and so vLLM) use when tools are given
        self.tool_use_template = tool_use_template
        # SentencePiece adds a space before the text; decoding drops it again at sequence start
        self.strip_leading_space = strip_leading_space
        self.special_token_ids = frozenset(
            i for i, t in enumerate(token_types) if t in (CONTROL, USER_DEFINED, UNKNOWN))
        # what skip_special_tokens drops (as llama.cpp's token_to_piece with special=False)
        self._hidden = frozenset(i for i, t in enumerate(token_types) if t in (CONTROL, UNKNOWN))
        # eos, eot/eom ids, generation_config eos ids and llama.cpp's end-of-turn token texts
        self.eos_token_ids = frozenset(i for i in eos_token_ids if i is not None)

    # --- construction ---------------------------------------------------------------------
    @classmethod
    def from_gguf_metadata(cls, meta: dict) -> "Tokenizer":
        return cls(**build_from_gguf(meta))

    @classmethod
    def from_checkpoint(cls, ckpt) -> "Tokenizer":
        """A loader.LoadedCheckpoint's tokenizer; errors name the file."""
        if ckpt.format != "gguf":
            tok = cls.from_hf_dir(ckpt.path)
        else:
            try:
                tok = cls.from_gguf_metadata(ckpt.gguf_metadata)
            except ValueError as e:
                raise ValueError(f"tokenizer: {ckpt.path}: {str(e).removeprefix('tokenizer: ')}") from None
        tok._pad_vocab(ckpt.config.vocab_size)
        return tok

    def _pad_vocab(self, n: int) -> None:
        """Embedding rows past the tokenizer's last id (Qwen2.5: 151,936 rows, 151,665 tokens) as
        unused '[PAD{id}]' tokens that decode to nothing, as llama.cpp's converter writes them into
        GGUF files: sampling or prompting one of those ids raised in the detokenizer."""
        for i in range(len(self._tokens), n):
            self._tokens.append(f"[PAD{i}]")
            self._types.append(UNUSED)
            self._pieces.append(b"")

    @classmethod
    def from_gguf(cls, path: str) -> "Tokenizer":
        from .loader.gguf import read_metadata
        return cls.from_gguf_metadata(read_metadata(path))

    @classmethod
    def from_hf_dir(cls, path: str) -> "Tokenizer":
        from .tokenizer_hf import build_from_hf_dir
        return cls(**build_from_hf_dir(path))

    # --- properties ---------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def token_type(self, token_id: int) -> int:
        return self._types[token_id]

    # --- encode / decode ----------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"tokenizer: encode() needs a str, got {type(text).__name__}")
        try:
            ids = self._encode_text(text) if text else []
        except (TypeError, UnicodeEncodeError) as e:  # lone surrogates, e.g. from JSON "\ud83d"
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as bad:
                raise ValueError(f"tokenizer: text has an invalid character at index {bad.start} "
                                 f"(lone surrogate)") from None
            raise e
        if add_special_tokens:
            ids = ([self.bos_token_id] if self.add_bos else []) + ids + list(self.suffix_ids)
        return ids

    def _check(self, token_id: int) -> int:
        if not 0 <= token_id < len(self._tokens):
            raise ValueError(f"tokenizer: token id {token_id} out of range (vocab size {len(self._tokens)})")
        return token_id

    def token_bytes(self, token_id: int) -> bytes:
        return self._pieces[self._check(int(token_id))]

    def id_to_piece(self, token_id: int) -> str:
        return self.token_bytes(token_id).decode("utf-8", errors="replace")

    def logprob_token(self, token_id: int, at_start: bool = False) -> str:
        """A token's text in log-probabilities (vLLM's decoded_token, OpenAI's token and top_logprobs
        keys): its bytes as text, a part of a character as U+FFFD (token_bytes keeps the bytes), and
        a SentencePiece '\u2581' as the space it is in the text, where decode([id]) drops it as the
        start of a sequence. at_start: the token begins the text (an echoed prompt's first token),
        where the text has no such space. For byte-level BPE the same as decode([id])."""
        return self.decode([token_id]) if at_start else self.id_to_piece(token_id)

    def id_to_token(self, token_id: int) -> str:
        """The vocabulary entry itself (e.g. 'Ġhello', '▁hello', '<0x0A>')."""
        return self._tokens[self._check(int(token_id))]

    def _render(self, token_id: int, skip_special_tokens: bool, shown=()) -> bytes:
        token_id = self._check(int(token_id))
        if skip_special_tokens and token_id in self._hidden and token_id not in shown:
            return b""
        return self._pieces[token_id]

    def hidden_token_ids(self, texts: Iterable[str]) -> list[int]:
        """Ids of the tokens among these texts (each one whole token) that skip_special_tokens drops."""
        out = []
        for t in texts:
            ids = self.encode(t, add_special_tokens=False)
            if len(ids) == 1 and ids[0] in self._hidden:
                out.append(ids[0])
        return out

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        parts = []
        at_start = self.strip_leading_space
        for i in ids:
            b = self._render(i, skip_special_tokens)
            if at_start and b:
                at_start = False
                if b[:1] == b" ":
                    b = b[1:]
            parts.append(b)
        return b"".join(parts).decode("utf-8", errors="replace")

    # --- chat ---------------------------------------------------------------------------------
    def chat_template_for(self, tools) -> str | None:
        """The template a conversation is rendered with, chosen as transformers does: the "tool_use"
        one when tools are given (not None) and the model has one, else the default."""
        return self.tool_use_template if tools is not None and self.tool_use_template else self.chat_template

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list | None = None, continue_final_message: bool = False,
                            chat_template: str | None = None, **extra) -> str:
        """chat_template: a template's text used instead of the model's."""
        from .chat_template import render_chat
        bos = self._tokens[self.bos_token_id] if self.bos_token_id is not None else ""
        eos = self._tokens[self.eos_token_id] if self.eos_token_id is not None else ""
        template = self.chat_template_for(tools) if chat_template is None else chat_template
        return render_chat(template, messages, add_generation_prompt=add_generation_prompt,
                           tools=tools, bos_token=bos, eos_token=eos, continue_final_message=continue_final_message,
                           **extra)


class IncrementalDetokenizer:
    """Turns a stream of generated token ids into text deltas.

    Bytes that do not yet form a whole UTF-8 character are held back; a byte that can never
    complete one becomes U+FFFD at once (Python's incremental UTF-8 decoder, which gives the
    same text as decoding everything at the end). Call flush() after the last token to get a
    still-incomplete tail as U+FFFD.

    With prompt_ids (non-empty), the first generated token continues a sequence, so a
    SentencePiece leading '▁' stays a space; without them the stream equals decode(ids).
    `shown`: special token ids written out even with skip_special_tokens (SamplingParams'
    preserved_token_ids).
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int] | None = None,
                 skip_special_tokens: bool = True, shown: Iterable[int] = ()):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.shown = frozenset(shown)
        self._pending = b""  # the start of a UTF-8 character whose last bytes have not come yet
        self._strip = tokenizer.strip_leading_space and not prompt_ids

    def push(self, token_id: int) -> str:
        b = self.tokenizer._render(token_id, self.skip_special_tokens, self.shown)
        if not b:
            return ""
        if self._strip:
            self._strip = False
            if b[:1] == b" ":
                b = b[1:]
        # what codecs' incremental UTF-8 decoder does, without its Python-level call per token
        if self._pending:
            b = self._pending + b
        text, used = codecs.utf_8_decode(b, "replace", False)
        self._pending = b[used:]
        return text

    def flush(self) -> str:
        text, _ = codecs.utf_8_decode(self._pending, "replace", True)
        self._pending = b""
        return text
