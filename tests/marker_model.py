"""A tiny random-weight model whose tokenizer has tool-call markers as special tokens: tiny_llama
(tests/fixtures) with its special tokens <|endoftext|> (id 317) and <|im_start|> (318) renamed to the
markers. A tool-call marker is a control token of the real models that have one (Mistral's
[TOOL_CALLS] and [ARGS], DeepSeek's <｜tool▁calls▁begin｜>...), which SmolLM2 lacks; a random model
writes the call-start marker where logit_bias pushes it."""
import os
import shutil

from .seeded_checkpoints import TOKENIZER

MARKER_ID = 317
RENAMED = ("<|endoftext|>", "<|im_start|>")


def with_markers(out: str, *markers: str) -> str:
    """tiny_llama copied into out with tokens 317, 318 spelled as `markers` (one or two); out's path."""
    shutil.copytree(TOKENIZER, out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        path = os.path.join(out, name)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for old, new in zip(RENAMED, markers):
            text = text.replace(old, new)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return out
