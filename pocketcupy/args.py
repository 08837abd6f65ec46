"""EngineArgs: every engine setting in one validated dataclass, with CLI and environment bridges."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass, fields

from .quant.act_q8 import check_mode
from .quant.kv_quant import check_kv_cache_dtype

ENV_PREFIX = "POCKETCUPY_"
SPECULATIVE_METHODS = ("none", "ngram", "draft_model", "mtp")
SPECULATIVE_ALIASES = {"deepseek_mtp": "mtp"}   # vLLM's name
TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass
class EngineArgs:
    model: str | None = None               # .gguf file or HF folder; None = SmolLM2-135M-Instruct
    device: str = "auto"                   # "auto" | "cpu" | "cuda"
    max_model_len: int | None = None       # default: the model's context length
    block_size: int = 16                   # tokens per KV block
    num_kv_blocks: int | None = None       # explicit KV pool size (overrides kv_cache_memory)
    kv_cache_memory: int | None = None     # bytes for the KV pool + recurrent state slots (default: 512 MiB on CPU)
    kv_cache_dtype: str = "auto"           # "auto" (the backend's float type) | "int8" | "fp8" (E4M3) | "k8v4"
                                           # (int8 K, int4 V): codes + a scale per token and KV head (quant/kv_quant.py)
    max_num_seqs: int = 64                 # requests running at once
    max_num_batched_tokens: int = 2048     # tokens per step (longer prompts are prefilled in chunks)
    enable_prefix_caching: bool = True     # reuse KV blocks of equal prompt prefixes across requests
    scheduling_policy: str = "fcfs"        # "fcfs" | "priority" (lower priority value first)
    seed: int | None = None                # engine-wide seed for requests without their own
    cache_dir: str | None = None           # where the default model is downloaded
    progress: bool = True                  # progress bar while loading
    gpu_memory_utilization: float = 0.9    # CUDA: fraction of GPU memory for weights + KV + activations
    cuda_graphs: bool = True               # CUDA: replay decode steps as graphs (False = eager)
    tensor_parallel_size: int = 1          # ranks (one GPU each; processes on the CPU) the model is split over
    quant_activations: str = "auto"        # quantized linears' activations: "auto" | "q8" | "f32" (quant/act_q8.py)
    async_scheduling: str = "auto"         # launch step N+1 before step N's tokens reach the host: "auto" (on
                                           # for CUDA on one rank) | "on" | "off"
    speculative_method: str = "none"       # "none" | "ngram" | "draft_model" | "mtp" (the checkpoint's multi-
                                           # token-prediction layer; "deepseek_mtp" too): draft tokens verified
                                           # in one forward (spec/)
    speculative_model: str | None = None   # draft_model: the draft model's file or folder (same vocabulary)
    num_speculative_tokens: int = 4        # draft tokens a request proposes per step
    prompt_lookup_min: int = 2             # ngram: shortest suffix looked up in the request's tokens
    prompt_lookup_max: int = 4             # ngram: longest suffix looked up
    speculative_config: dict | str | None = None   # vLLM's form of the five above (a dict or its JSON text):
                                           # method, model, num_speculative_tokens, prompt_lookup_min/max

    def __post_init__(self):
        def positive(name, allow_none=False):
            v = getattr(self, name)
            if v is None and allow_none:
                return
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}: must be a positive integer, got {v!r}")

        if isinstance(self.model, os.PathLike):
            self.model = os.fspath(self.model)
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            raise ValueError(f"model: must be a path, got {self.model!r}")
        if self.speculative_config is not None:
            self._apply_speculative_config()
        if isinstance(self.speculative_model, os.PathLike):
            self.speculative_model = os.fspath(self.speculative_model)
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device: must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size",
                     "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"):
            positive(name)
        for name in ("max_model_len", "num_kv_blocks", "kv_cache_memory"):
            positive(name, allow_none=True)
        gmu = self.gpu_memory_utilization
        if not isinstance(gmu, (int, float)) or isinstance(gmu, bool) or not 0 < gmu <= 1:
            raise ValueError(f"gpu_memory_utilization: must be in (0, 1], got {self.gpu_memory_utilization!r}")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling_policy: must be 'fcfs' or 'priority', got {self.scheduling_policy!r}")
        for f in fields(self):
            if f.type == "bool" and not isinstance(getattr(self, f.name), bool):
                raise ValueError(f"{f.name}: must be a bool, got {getattr(self, f.name)!r}")
        check_mode(self.quant_activations)
        check_kv_cache_dtype(self.kv_cache_dtype)
        if self.async_scheduling not in ("auto", "on", "off"):
            raise ValueError(f"async_scheduling: must be 'auto', 'on' or 'off', got {self.async_scheduling!r}")
        if self.async_scheduling == "on" and self.tensor_parallel_size > 1:
            raise ValueError("async_scheduling: 'on' needs one rank (tensor-parallel ranks get their input "
                             "tokens from the host)")
        if isinstance(self.speculative_method, str):
            self.speculative_method = SPECULATIVE_ALIASES.get(self.speculative_method, self.speculative_method)
        if self.speculative_method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative_method: must be one of {', '.join(map(repr, SPECULATIVE_METHODS))}, "
                             f"got {self.speculative_method!r}")
        if (self.speculative_method == "draft_model") != (self.speculative_model is not None):
            raise ValueError("speculative_model: " + ("speculative_method 'draft_model' needs the draft model's path"
                                                      if self.speculative_model is None else
                                                      "is read only with speculative_method 'draft_model'"))
        if self.speculative_model is not None and (not isinstance(self.speculative_model, str)
                                                   or not self.speculative_model):
            raise ValueError(f"speculative_model: must be a path, got {self.speculative_model!r}")
        if self.speculative_method == "mtp" and self.tensor_parallel_size > 1:
            raise ValueError("speculative_method: 'mtp' runs on one rank only for now, not with "
                             f"tensor_parallel_size={self.tensor_parallel_size}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min: {self.prompt_lookup_min} exceeds prompt_lookup_max "
                             f"{self.prompt_lookup_max}")
        if self.speculative_method != "none" and self.async_scheduling == "on":
            raise ValueError("async_scheduling: 'on' cannot be combined with speculative decoding (the next step's "
                             "draft tokens need this step's tokens on the host)")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise ValueError(f"seed: must be an integer, got {self.seed!r}")

    def _apply_speculative_config(self) -> None:
        """Sets the speculative_* fields from vLLM's speculative_config (a "model" without a
        "method" means a draft model), then drops it, so the fields alone describe the settings."""
        cfg = self.speculative_config
        if isinstance(cfg, str):
            try:
                cfg = json.loads(cfg)
            except json.JSONDecodeError as e:
                raise ValueError(f"speculative_config: not valid JSON ({e})") from None
        if not isinstance(cfg, dict):
            raise ValueError(f"speculative_config: must be a dict (or its JSON text), got {cfg!r:.80}")
        names = {"method": "speculative_method", "model": "speculative_model", **{
            k: k for k in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")}}
        unknown = sorted(set(cfg) - set(names))
        if unknown:
            raise ValueError(f"speculative_config: unknown key {unknown[0]!r} (known: {', '.join(names)})")
        if "model" in cfg and "method" not in cfg:
            cfg = {**cfg, "method": "draft_model"}
        defaults = {f.name: f.default for f in fields(self)}
        for key, value in cfg.items():
            name = names[key]
            if getattr(self, name) != defaults[name]:
                raise ValueError(f"speculative_config: sets {name}, which is also given on its own")
            setattr(self, name, value)
        self.speculative_config = None

    # --- bridges -------------------------------------------------------------------------
    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        for f in fields(cls):
            flag = "--" + f.name.replace("_", "-")
            if f.type == "bool":
                parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
            else:
                kind = int if "int" in f.type else float if "float" in f.type else str
                parser.add_argument(flag, type=kind, default=None)

    @classmethod
    def from_cli(cls, ns: argparse.Namespace) -> "EngineArgs":
        """CLI values override POCKETCUPY_* environment values, which override the defaults."""
        base = cls.from_env()
        given = {f.name: getattr(ns, f.name) for f in fields(cls) if getattr(ns, f.name, None) is not None}
        return dataclasses.replace(base, **given)

    @classmethod
    def from_env(cls, environ=None) -> "EngineArgs":
        environ = os.environ if environ is None else environ
        values = {}
        for f in fields(cls):
            raw = environ.get(ENV_PREFIX + f.name.upper())
            if raw is None:
                continue
            if f.type == "bool":
                word = raw.strip().lower()
                if word not in TRUE_WORDS + FALSE_WORDS:
                    raise ValueError(f"{f.name}: {ENV_PREFIX}{f.name.upper()}={raw!r} is not one of "
                                     f"{', '.join(TRUE_WORDS + FALSE_WORDS)}")
                values[f.name] = word in TRUE_WORDS
            elif "int" in f.type or "float" in f.type:
                kind = int if "int" in f.type else float
                try:
                    values[f.name] = kind(raw)
                except ValueError:
                    raise ValueError(f"{f.name}: {ENV_PREFIX}{f.name.upper()}={raw!r} is not a number") from None
            else:
                values[f.name] = raw
        return cls(**values)
