"""EngineArgs: every engine setting in one validated dataclass, with CLI and environment bridges."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
from dataclasses import dataclass, field, fields

from .quant.act_q8 import check_mode
from .quant.kv_quant import check_kv_cache_dtype

ENV_PREFIX = "POCKETCUPY_"
SPECULATIVE_METHODS = ("none", "ngram", "draft_model", "mtp")
SPECULATIVE_ALIASES = {"deepseek_mtp": "mtp"}   # vLLM's name
TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([kmgt])(i?)b?|b?)", re.IGNORECASE)


def size_in_bytes(text: str) -> int:
    """A byte count written as an integer or with a unit: 1073741824, 512MiB, 1.5GiB, 4G (powers of
    1024), 2GB (of 1000). ValueError otherwise."""
    m = _SIZE.fullmatch(str(text).strip())
    if m is None:
        raise ValueError(f"{text!r} is not a size in bytes (e.g. 1073741824, 512MiB, 4GiB, 2GB)")
    num, letter, binary = m.groups()
    power = "kmgt".index(letter.lower()) + 1 if letter else 0
    whole_word = letter and not binary and m.group(0).lower().endswith("b")    # KB, MB, GB, TB: decimal
    value = float(num) * (1000 if whole_word else 1024) ** power
    if value != int(value):
        raise ValueError(f"{text!r} is not a whole number of bytes")
    return int(value)


def _opt(default, help: str, parse=None):
    """An EngineArgs field with the help text its CLI flag shows (parse: its CLI / environment
    values' type, where not int / float / str by the annotation)."""
    return field(default=default, metadata={"help": help, "parse": parse})


@dataclass
class EngineArgs:
    model: str | None = _opt(None, "a .gguf file or Hugging Face folder (default: SmolLM2-135M-Instruct, downloaded)")
    device: str = _opt("auto", "'auto' (CUDA where a GPU is present), 'cpu' or 'cuda'")
    max_model_len: int | None = _opt(None, "longest prompt + output in tokens (default: the model's context length)")
    block_size: int = _opt(16, "tokens per KV cache block")
    num_kv_blocks: int | None = _opt(None, "KV pool size in blocks (overrides kv_cache_memory)")
    kv_cache_memory: int | None = _opt(None, "bytes for the KV pool and recurrent state slots, e.g. 4GiB (default: "
                                             "512 MiB on the CPU; on CUDA what gpu_memory_utilization leaves)",
                                       size_in_bytes)
    kv_cache_dtype: str = _opt("auto", "'auto' (the backend's float type), 'int8', 'fp8' (E4M3) or 'k8v4' (int8 K, "
                                       "int4 V): codes and a scale per token and KV head (quant/kv_quant.py)")
    max_num_seqs: int = _opt(64, "requests running at once")
    max_num_batched_tokens: int = _opt(2048, "tokens per step (longer prompts are prefilled in chunks)")
    enable_prefix_caching: bool = _opt(True, "reuse the KV blocks of equal prompt prefixes across requests")
    scheduling_policy: str = _opt("fcfs", "'fcfs' or 'priority' (lower priority value first)")
    seed: int | None = _opt(None, "engine-wide seed for requests without their own")
    score_tokens: str | None = _opt(None, "score / rerank as a reranker such as Qwen3-Reranker: 'no,yes' (two "
                                          "one-token texts): a pair's score is P(yes) against P(no) after its "
                                          "text (default: the cosine of the texts' embeddings)")
    generation_config: str = _opt("auto", "sampling defaults of requests that leave a setting out: 'auto' (the "
                                          "model's recommended ones: a GGUF's general.sampling.*, a folder's "
                                          "generation_config.json) or 'vllm' (none: SamplingParams' own)")
    cache_dir: str | None = _opt(None, "where the default model is downloaded (default: $POCKETCUPY_CACHE, else "
                                       "~/.cache/pocketcupy)")
    progress: bool = _opt(True, "a progress bar while loading")
    gpu_memory_utilization: float = _opt(0.9, "CUDA: the fraction of GPU memory for weights, KV cache and "
                                              "activations")
    cuda_graphs: bool = _opt(True, "CUDA: replay decode steps as graphs (off: eager)")
    tensor_parallel_size: int = _opt(1, "ranks the model is split over (one GPU each; processes on the CPU)")
    quant_activations: str = _opt("auto", "quantized linears' activations: 'auto', 'q8' or 'f32' (quant/act_q8.py)")
    async_scheduling: str = _opt("auto", "launch step N+1 before step N's tokens reach the host: 'auto' (on for "
                                         "CUDA on one rank), 'on' or 'off'; with speculative decoding only "
                                         "after steps at which no request drafts")
    speculative_method: str = _opt("none", "'none', 'ngram', 'draft_model' or 'mtp' (the checkpoint's multi-token-"
                                           "prediction layer; 'deepseek_mtp' too): draft tokens verified in one "
                                           "forward (spec/)")
    speculative_model: str | None = _opt(None, "draft_model: the draft model's file or folder (same vocabulary)")
    num_speculative_tokens: int = _opt(4, "draft tokens a request proposes per step")
    prompt_lookup_min: int = _opt(2, "ngram: the shortest suffix looked up in the request's tokens")
    prompt_lookup_max: int = _opt(4, "ngram: the longest suffix looked up")
    speculative_adaptive: bool = _opt(True, "each request drafts only as many tokens as its kept drafts pay for, "
                                            "at the measured cost (spec/adaptive.py; off: always "
                                            "num_speculative_tokens)")
    speculative_config: dict | str | None = _opt(None, "vLLM's form of the five above (a dict or its JSON text): "
                                                       "method, model, num_speculative_tokens, prompt_lookup_min/max")

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
        if isinstance(self.cache_dir, os.PathLike):
            self.cache_dir = os.fspath(self.cache_dir)
        if self.cache_dir is not None and not isinstance(self.cache_dir, str):
            raise ValueError(f"cache_dir: must be a path or None, got {self.cache_dir!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device: must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size",
                     "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"):
            positive(name)
        if isinstance(self.kv_cache_memory, str):   # "4GiB", as on the command line
            try:
                self.kv_cache_memory = size_in_bytes(self.kv_cache_memory)
            except ValueError as e:
                raise ValueError(f"kv_cache_memory: {e}") from None
        for name in ("max_model_len", "num_kv_blocks", "kv_cache_memory"):
            positive(name, allow_none=True)
        gmu = self.gpu_memory_utilization
        if not isinstance(gmu, (int, float)) or isinstance(gmu, bool) or not 0 < gmu <= 1:
            raise ValueError(f"gpu_memory_utilization: must be in (0, 1], got {self.gpu_memory_utilization!r}")
        if self.generation_config not in ("auto", "vllm"):
            raise ValueError(f"generation_config: must be 'auto' or 'vllm', got {self.generation_config!r}")
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
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min: {self.prompt_lookup_min} exceeds prompt_lookup_max "
                             f"{self.prompt_lookup_max}")
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
            default = "" if "(default" in f.metadata["help"] else f"default {f.default!r}; "
            help = f"{f.metadata['help']} ({default}env {ENV_PREFIX}{f.name.upper()})"
            if f.type == "bool":
                parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help)
            else:
                parser.add_argument(flag, type=_cli_type(f), default=None, help=help)

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
            elif f.metadata["parse"] is not None:
                try:
                    values[f.name] = f.metadata["parse"](raw)
                except ValueError as e:
                    raise ValueError(f"{f.name}: {ENV_PREFIX}{f.name.upper()}={e}") from None
            elif "int" in f.type or "float" in f.type:
                kind = int if "int" in f.type else float
                try:
                    values[f.name] = kind(raw)
                except ValueError:
                    raise ValueError(f"{f.name}: {ENV_PREFIX}{f.name.upper()}={raw!r} is not a number") from None
            else:
                values[f.name] = raw
        return cls(**values)


def _cli_type(f):
    """The argparse type of an EngineArgs field: its parse function (whose ValueError argparse shows
    as the flag's error), else int / float / str by its annotation."""
    parse = f.metadata["parse"]
    if parse is None:
        return int if "int" in f.type else float if "float" in f.type else str

    def typed(text):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    typed.__name__ = parse.__name__
    return typed
