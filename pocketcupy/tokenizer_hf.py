"""Build a Tokenizer from a Hugging Face folder (tokenizer.json + tokenizer_config.json)."""
from __future__ import annotations

import json
import os
import re

from .tokenizer_gguf import BYTE, CONTROL, EOG_TEXTS, NORMAL, USER_DEFINED, bytelevel_bytes

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"tokenizer: {path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"tokenizer: {path} must hold a JSON object")
    return data


def _token_text(v) -> str | None:
    """tokenizer_config stores special tokens as a string or as a serialized AddedToken dict."""
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


def _decoder_types(dec) -> list[dict]:
    if not isinstance(dec, dict):
        return []
    if dec.get("type") == "Sequence":
        return [d for sub in dec.get("decoders", []) for d in _decoder_types(sub)]
    return [dec]


def _chat_templates(path: str, cfg: dict) -> tuple[str | None, str | None]:
    """(default, "tool_use") chat templates: tokenizer_config.json's chat_template (a string, or a
    list of {"name", "template"} as transformers saves several), else chat_template.jinja and
    additional_chat_templates/tool_use.jinja."""
    tpl, named = cfg.get("chat_template"), {}
    if isinstance(tpl, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        tpl = named.get("default") or next(iter(named.values()), None)

    def read(file):
        if os.path.isfile(file):
            with open(file, encoding="utf-8") as f:
                return f.read()
        return None

    if tpl is None:
        tpl = read(os.path.join(path, "chat_template.jinja"))
    tool_use = named.get("tool_use") or read(os.path.join(path, "additional_chat_templates", "tool_use.jinja"))
    return (tpl if isinstance(tpl, str) else None), (tool_use if isinstance(tool_use, str) else None)


def build_from_hf_dir(path: str) -> dict:
    from tokenizers import Tokenizer as HFTokenizer

    tj_path = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(tj_path):
        raise ValueError(f"tokenizer: no tokenizer.json in {path}")
    try:
        tk = HFTokenizer.from_file(tj_path)
    except Exception as e:  # tokenizers raises plain Exception
        raise ValueError(f"tokenizer: cannot load {tj_path}: {e}") from e
    tj = _read_json(tj_path)
    cfg_path = os.path.join(path, "tokenizer_config.json")
    cfg = _read_json(cfg_path) if os.path.isfile(cfg_path) else {}
    gen_path = os.path.join(path, "generation_config.json")
    gen = _read_json(gen_path) if os.path.isfile(gen_path) else {}

    n = tk.get_vocab_size(with_added_tokens=True)
    tokens = [tk.id_to_token(i) or "" for i in range(n)]
    types = [NORMAL] * n
    added = tk.get_added_tokens_decoder()
    for i, tok in added.items():
        if i < n:
            types[i] = CONTROL if tok.special else USER_DEFINED

    decs = _decoder_types(tj.get("decoder"))
    kinds = {d.get("type") for d in decs}
    model = tj.get("model") or {}
    byte_level = "ByteLevel" in kinds
    spm_like = not byte_level and (bool(kinds & {"ByteFallback", "Metaspace"}) or model.get("byte_fallback")
                                   or any(d.get("type") == "Replace" for d in decs))
    strip = any(d.get("type") == "Strip" and d.get("start", 0) > 0 for d in decs) or any(
        d.get("type") == "Metaspace" and (d.get("prepend_scheme") in ("always", "first") or d.get("add_prefix_space"))
        for d in decs)

    pieces = []
    for i, t in enumerate(tokens):
        if types[i] != NORMAL:
            pieces.append(t.encode("utf-8"))
        elif byte_level:
            pieces.append(bytelevel_bytes(t))
        elif spm_like:
            m = _BYTE_TOKEN.fullmatch(t)
            if m:
                types[i] = BYTE
                pieces.append(bytes([int(m.group(1), 16)]))
            else:
                pieces.append(t.replace("\u2581", " ").encode("utf-8"))
        else:
            pieces.append(tk.decode([i], skip_special_tokens=False).encode("utf-8"))

    vocab = tk.get_vocab(with_added_tokens=True)
    bos = vocab.get(_token_text(cfg.get("bos_token")) or "")
    eos = vocab.get(_token_text(cfg.get("eos_token")) or "")
    gen_eos = gen.get("eos_token_id")
    gen_eos = [gen_eos] if isinstance(gen_eos, int) else [i for i in (gen_eos or []) if isinstance(i, int)]
    if eos is None and gen_eos:
        eos = gen_eos[0]
    if bos is None and isinstance(gen.get("bos_token_id"), int):
        bos = gen["bos_token_id"]
    eog = {eos, *gen_eos} | {vocab[t] for t in EOG_TEXTS if t in vocab and types[vocab[t]] == CONTROL}

    # what the post-processor puts around a text (we add it ourselves): BOS before, EOS (or another
    # special token, as Qwen3-Embedding's <|endoftext|>) after; tokenizer_config's flags decide first
    plain, with_sp = tk.encode("a", add_special_tokens=False).ids, tk.encode("a", add_special_tokens=True).ids
    at = next((i for i in range(len(with_sp) - len(plain) + 1) if with_sp[i:i + len(plain)] == plain), None)
    prefix, suffix = ([], []) if at is None else (with_sp[:at], with_sp[at + len(plain):])
    add_bos = cfg.get("add_bos_token")
    if add_bos is None:
        add_bos = bos is not None and prefix == [bos]
    add_eos = cfg.get("add_eos_token")
    if add_eos is not None:
        suffix = [eos] if add_eos and eos is not None else []

    def encode_text(text: str) -> list[int]:
        return tk.encode(text, add_special_tokens=False).ids

    templates = _chat_templates(path, cfg)
    return dict(
        tokens=tokens, token_types=types, piece_bytes=pieces, encode_text=encode_text,
        bos_token_id=bos, eos_token_id=eos, eos_token_ids=eog, add_bos=bool(add_bos),
        chat_template=templates[0], tool_use_template=templates[1], strip_leading_space=bool(spm_like and strip),
        suffix_ids=suffix,
    )
