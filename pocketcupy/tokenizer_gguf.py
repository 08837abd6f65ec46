"""Build a Tokenizer from GGUF metadata, following llama.cpp's llama-vocab.cpp.

"gpt2" (byte-level BPE) runs on the `tokenizers` library: llama.cpp's pre-tokenizer regexes
become a chain of isolating Split steps (each regex splits the pieces the previous one left,
as llama.cpp's unicode_regex_split does), then byte-level mapping and rank-ordered merges.
"llama" (SentencePiece) runs llama.cpp's score-ordered bigram merge directly in Python, so
ties, byte fallback and unknown characters come out as llama.cpp has them.
"""
from __future__ import annotations

import heapq
from typing import Callable

# GGUF tokenizer.ggml.token_type values
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Tokens llama.cpp treats as end of generation by their text (llama-vocab.cpp, special_eog_ids).
EOG_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
    "<EOT>", "<|end_of_text|>", "<|return|>", "<|call|>", "<｜end▁of▁sentence｜>",
)

# --- llama.cpp pre-tokenizer regexes (llm_tokenizer_bpe), written for Oniguruma ---------------
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTR = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = _CONTR + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _CONTR + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35 = (_CONTR + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEEPSEEK_LLM = [  # non-ASCII as escapes: an editor's Unicode normalization would change the ranges
    r"[\r\n]",
    ("\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-"
     "\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1"
     "\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-"
     "\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15"
     "\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d"
     "\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb"
     "\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d"
     "\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183"
     "\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b"
     "\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-"
     "\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb"
     "\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+"),
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    "\\s+$",
    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    r"\p{N}+",
]
_DEEPSEEK_CODER = [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", r"\p{N}"]
_DEEPSEEK3 = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
    r"""| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
]
_UPPER, _LOWER = r"((?=[\p{L}])([^a-z]))", r"((?=[\p{L}])([^A-Z]))"
_TEKKEN = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTR}?|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTR}?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PORO = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"

# name -> (regexes, ignore_merges, add_bos default)
_PRE_KINDS = {
    "default": ([r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"], False, False),
    "llama3": ([_LLAMA3], True, True),
    "llama3-merges": ([_LLAMA3], False, False),
    "deepseek-llm": (_DEEPSEEK_LLM, False, False),
    "deepseek-coder": (_DEEPSEEK_CODER, False, False),
    "deepseek-v3": (_DEEPSEEK3, False, False),
    "falcon": ([r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"], False, False),
    "starcoder": ([r"\p{N}", _GPT2], False, False),
    "gpt2": ([_GPT2], False, False),
    "qwen2": ([_QWEN2], False, False),
    "qwen35": ([_QWEN35], False, False),
    "poro": ([_PORO], False, False),
    "viking": ([_PORO, r"\p{N}"], False, False),
    "tekken": ([_TEKKEN], True, True),
    "gpt-4o": ([_GPT4O], False, False),
}
_PRE_ALIASES = {
    "llama3": ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"),
    "llama3-merges": ("dbrx", "smaug-bpe", "chatglm-bpe"),
    "deepseek-llm": ("deepseek-llm",), "deepseek-coder": ("deepseek-coder",),
    "deepseek-v3": ("deepseek-v3", "hunyuan-dense"),
    "falcon": ("falcon",),
    "starcoder": ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b",
                  "mellum2"),
    "gpt2": ("gpt2", "gpt-2", "mpt", "phi-2", "olmo", "jais", "jina-es", "jina-de", "jina-v1-en",
             "jina-v2-es", "jina-v2-de", "jina-v2-code", "roberta-bpe", "gigachat", "trillion",
             "granite-docling", "exaone4", "a.x-4.0", "mellum"),
    "qwen2": ("qwen2", "deepseek-r1-qwen", "megrez", "stablelm2", "hunyuan", "solar-open", "kormo"),
    "qwen35": ("qwen35",),
    "poro": ("poro-chat", "bloom", "gpt3-finnish"), "viking": ("viking",),
    "tekken": ("tekken",), "gpt-4o": ("gpt-4o", "llama4", "minimax-m2"),
    "default": ("default",),
}
PRE_TYPES = {alias: kind for kind, names in _PRE_ALIASES.items() for alias in names}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_ENCODER = _bytes_to_unicode()
BYTE_DECODER = {c: b for b, c in BYTE_ENCODER.items()}


# each byte-level character -> the character of its byte's code; a character from U+0080 to U+00FF that
# is none of them -> U+FFFF (its UTF-8 bytes are not its Latin-1 byte: the slow path takes it)
_TO_LATIN1 = {**{i: 0xFFFF for i in range(0x80, 0x100)}, **{ord(c): b for c, b in BYTE_DECODER.items()}}


def bytelevel_bytes(text: str) -> bytes:
    try:    # every character a byte-level one or ASCII (UTF-8 = Latin-1 there): one C pass, not one per character
        return text.translate(_TO_LATIN1).encode("latin-1")
    except UnicodeEncodeError:
        return b"".join(bytes([BYTE_DECODER[c]]) if c in BYTE_DECODER else c.encode("utf-8") for c in text)


def split_special(text: str, specials: list[tuple[str, int]]) -> list:
    """llama.cpp's tokenizer_st_partition: cut `text` at each special token's literal occurrences,
    longest tokens first. Returns raw-text pieces (str) and token ids (int) in order."""
    frags: list = [text]
    for s, sid in specials:
        if s not in text:
            continue
        out: list = []
        for f in frags:
            if isinstance(f, int) or s not in f:
                out.append(f)
                continue
            for i, part in enumerate(f.split(s)):
                if i:
                    out.append(sid)
                if part:
                    out.append(part)
        frags = out
    return frags


def _meta_id(meta: dict, key: str, n: int, default: int | None) -> int | None:
    v = meta.get(f"tokenizer.ggml.{key}")
    return int(v) if v is not None and 0 <= int(v) < n else default


def build_from_gguf(meta: dict) -> dict:
    """Keyword arguments for Tokenizer(...) from read_metadata()'s dict."""
    model = meta.get("tokenizer.ggml.model")
    if model is None:
        raise ValueError("tokenizer: GGUF metadata has no tokenizer (tokenizer.ggml.model)")
    if model not in ("gpt2", "llama"):
        raise ValueError(f"tokenizer: unsupported tokenizer model {model!r} (supported: 'gpt2', 'llama')")
    tokens = list(meta.get("tokenizer.ggml.tokens") or [])
    if not tokens:
        raise ValueError("tokenizer: GGUF metadata has no tokenizer.ggml.tokens")
    n = len(tokens)
    tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    types = list(meta.get("tokenizer.ggml.token_type") or [NORMAL] * n)
    if len(types) != n:
        raise ValueError(f"tokenizer: {len(types)} token types for {n} tokens")
    token_to_id = {t: i for i, t in enumerate(tokens)}

    eog = set()
    for t in EOG_TEXTS:  # llama.cpp forces these to control type and stops on them
        if t in token_to_id:
            types[token_to_id[t]] = CONTROL
            eog.add(token_to_id[t])

    if model == "gpt2":
        pre = meta.get("tokenizer.ggml.pre") or "default"
        if pre not in PRE_TYPES:
            raise ValueError(f"tokenizer: unsupported pre-tokenizer type {pre!r} (tokenizer.ggml.pre)")
        regexes, ignore_merges, add_bos_default = _PRE_KINDS[PRE_TYPES[pre]]
        if "tokenizer.ggml.merges" not in meta:   # as llama.cpp; without them every byte was a token
            raise ValueError("tokenizer: GGUF metadata has no tokenizer.ggml.merges (required by a 'gpt2' tokenizer)")
        bos, eos = _meta_id(meta, "bos_token_id", n, None), _meta_id(meta, "eos_token_id", n, None)
        add_space_prefix = False
        encode_raw = _bpe_encoder(tokens, token_to_id, meta.get("tokenizer.ggml.merges") or [], regexes, ignore_merges)

        def piece(i: int) -> bytes:
            return bytelevel_bytes(tokens[i]) if types[i] == NORMAL else b""
    else:
        add_bos_default = True
        bos, eos = _meta_id(meta, "bos_token_id", n, 1), _meta_id(meta, "eos_token_id", n, 2)
        unk = _meta_id(meta, "unknown_token_id", n, 0)
        add_space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
        scores = list(meta.get("tokenizer.ggml.scores") or [0.0] * n)
        if len(scores) != n:
            raise ValueError(f"tokenizer: {len(scores)} token scores for {n} tokens")
        encode_raw = _spm_encoder(token_to_id, scores, unk)

        def piece(i: int) -> bytes:
            if types[i] == NORMAL:
                return tokens[i].replace("\u2581", " ").encode("utf-8")
            if types[i] == BYTE:
                return bytes([int(tokens[i][3:5], 16)])
            return b""

    for key in ("eot_token_id", "eom_token_id"):
        tid = _meta_id(meta, key, n, None)
        if tid is not None:
            eog.add(tid)
    if eos is not None:
        eog.add(eos)

    literal = {CONTROL, USER_DEFINED, UNKNOWN}
    pieces = [tokens[i].encode("utf-8") if types[i] in literal else piece(i) for i in range(n)]
    specials = sorted(((tokens[i], i) for i in range(n) if types[i] in literal), key=lambda x: (-len(x[0]), x[1]))
    add_bos = meta.get("tokenizer.ggml.add_bos_token")
    fim = [_meta_id(meta, f"fim_{k}_token_id", n, None) for k in ("pre", "suf", "mid")]

    def encode_text(text: str) -> list[int]:
        out: list[int] = []
        prev_special = True  # SPM: a space prefix starts the text and follows each special token
        for frag in split_special(text, specials):
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
            else:
                out.extend(encode_raw(" " + frag if add_space_prefix and prev_special else frag))
                prev_special = False
        return out

    return dict(
        tokens=tokens, token_types=types, piece_bytes=pieces, encode_text=encode_text,
        bos_token_id=bos, eos_token_id=eos, eos_token_ids=eog,
        add_bos=add_bos_default if add_bos is None else bool(add_bos),
        suffix_ids=[eos] if meta.get("tokenizer.ggml.add_eos_token") and eos is not None else [],
        chat_template=meta.get("tokenizer.chat_template"), strip_leading_space=add_space_prefix,
        tool_use_template=meta.get("tokenizer.chat_template.tool_use"),  # llama.cpp's key for a named template
        fim_ids=None if None in fim else tuple(fim),
    )


def _bpe_encoder(tokens, token_to_id, merges, regexes, ignore_merges) -> Callable[[str], list[int]]:
    from tokenizers import Regex
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    pairs = []
    for m in merges:
        pos = m.find(" ", 1)
        if pos < 0:
            continue
        a, b = m[:pos], m[pos + 1:]
        # the tokenizers library rejects merges whose parts or result are not in the vocabulary;
        # llama.cpp could never emit those as tokens either
        if a in token_to_id and b in token_to_id and a + b in token_to_id:
            pairs.append((a, b))
    try:
        bpe = models.BPE(vocab=token_to_id, merges=pairs, ignore_merges=ignore_merges)
        tk = HFTokenizer(bpe)
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    except Exception as e:  # tokenizers raises plain Exception subclasses
        raise ValueError(f"tokenizer: cannot build the BPE tokenizer: {e}") from e

    def encode(text: str) -> list[int]:
        return tk.encode(text, add_special_tokens=False).ids

    return encode


def _spm_encoder(token_to_id: dict[str, int], scores: list[float], unk: int | None) -> Callable[[str], list[int]]:
    def byte_token(b: int) -> int | None:
        tid = token_to_id.get(f"<0x{b:02X}>")
        if tid is None:
            tid = token_to_id.get(chr(b)) if b < 128 else None
        return tid if tid is not None else unk

    def encode(text: str) -> list[int]:
        """llama.cpp's llm_tokenizer_spm_session: repeatedly merge the adjacent pair whose
        concatenation is the highest-scoring vocabulary token (leftmost on ties)."""
        sym = list(text.replace(" ", "\u2581"))
        n = len(sym)
        if n == 0:
            return []
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap: list = []

        def add(left: int, right: int):
            if left < 0 or right < 0:
                return
            t = sym[left] + sym[right]
            tid = token_to_id.get(t)
            if tid is not None:
                heapq.heappush(heap, (-scores[tid], left, right, len(t)))

        for i in range(1, n):
            add(i - 1, i)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            if not sym[left] or not sym[right] or len(sym[left]) + len(sym[right]) != size:
                continue  # stale: one side was merged since this pair was queued
            sym[left] += sym[right]
            sym[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            add(prv[left], left)
            add(left, nxt[left])

        out: list[int] = []
        i = 0
        while i != -1:
            tid = token_to_id.get(sym[i])
            if tid is not None:
                out.append(tid)
            else:
                for b in sym[i].encode("utf-8"):
                    bt = byte_token(b)
                    if bt is not None:
                        out.append(bt)
            i = nxt[i]
        return out

    return encode
