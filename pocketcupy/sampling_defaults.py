"""A model's recommended sampling settings, as vLLM's `--generation-config auto` reads them: a GGUF's
general.sampling.* keys (llama.cpp's converter writes them from generation_config.json), or a
Hugging Face folder's generation_config.json. A request that leaves a setting out gets the
model's (the server's fields; the library's params=None, as vLLM's get_default_sampling_params)."""
from __future__ import annotations

import json
import logging
import os

from .sampling import SamplingParams

log = logging.getLogger("pocketcupy")

GGUF_KEYS = {"general.sampling.temp": "temperature", "general.sampling.top_p": "top_p",
             "general.sampling.top_k": "top_k", "general.sampling.min_p": "min_p",
             "general.sampling.penalty_repeat": "repetition_penalty"}
HF_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def model_sampling_defaults(gguf_metadata: dict | None, folder: str | None) -> dict:
    """{SamplingParams field: value} of those the model recommends (a value SamplingParams refuses
    is left out, with a warning)."""
    if gguf_metadata is not None:
        found = {name: gguf_metadata[key] for key, name in GGUF_KEYS.items() if key in gguf_metadata}
    else:
        path = os.path.join(folder or "", "generation_config.json")
        cfg = {}
        if folder and os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                cfg = json.load(f)
        found = {k: cfg[k] for k in HF_KEYS if cfg.get(k) is not None}
    out = {}
    for name, value in found.items():
        value = int(value) if name == "top_k" else float(value)
        try:
            SamplingParams(**{name: value})
        except ValueError as e:
            log.warning("ignoring the model's recommended %s: %s", name, e)
            continue
        out[name] = value
    return out
