"""POST /v1/embeddings (OpenAI's, with vLLM's extensions): each input's final hidden states pooled
by the engine (Engine.embed's path: pooling requests batched with everything else)."""
from __future__ import annotations

import base64
import time

import numpy as np

from ..pooling import POOLING_TYPES, PoolingParams, default_pooling_type
from ..sampling import SamplingParams, truncate_prompt
from .chat import parse_template_fields, render_messages
from .completions import parse_prompts
from .generation import Job
from .protocol import CONTEXT_CODE, ApiError, Fields, bad, check_model, from_value_error
from .responses import new_id
from .tool_prompt import parse_messages

MAX_INPUTS = 2048     # OpenAI's limit of inputs per request
EMBED_DTYPES = ("float32", "float16", "bfloat16")   # vLLM's base64 dtypes but its fp8 ones (NumPy has none)
BYTE_ORDERS = {"little": "<", "big": ">", "native": "="}


def handle_embeddings(state, body, gone) -> dict:
    """{"model", "input": str | [str] | [ids] | [[ids]] (or vLLM's "messages" with chat-template options:
    the conversation's embedding), "encoding_format": "float" | "base64", "dimensions" (only the model's
    own), "user"; vLLM's "truncate_prompt_tokens", "normalize" (or "use_activation"), "priority", "add_special_tokens",
    "embed_dtype" and "endianness" (of base64); ours
    "pooling": "last" | "mean" (default: the model's own, else "last")} -> {"object": "list", "data":
    [{"object": "embedding", "index", "embedding"}], "model", "usage"}."""
    engine = state.engine
    tok = engine.tokenizer
    f = Fields(body)
    model = check_model(f, state.config.served_model_names)
    field = "messages" if f.get("messages") is not None else "input"
    if field == "messages":
        prompts = _chat_prompt(f, engine)
    else:
        prompts = parse_prompts(f.require("input"), tok, "input", MAX_INPUTS, f.bool("add_special_tokens", True))
    fmt = f.str("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise bad("encoding_format", f"'encoding_format' must be 'float' or 'base64', got {fmt!r}")
    dtype = f.str("embed_dtype", "float32")
    if dtype not in EMBED_DTYPES:
        raise bad("embed_dtype", f"'embed_dtype' must be one of {', '.join(map(repr, EMBED_DTYPES))}, got {dtype!r}")
    order = f.str("endianness", "little")
    if order not in BYTE_ORDERS:
        raise bad("endianness", f"'endianness' must be 'native', 'little' or 'big', got {order!r}")
    dims = f.int("dimensions", None, 1)
    if dims is not None and dims != engine.config.hidden_size:
        raise bad("dimensions", f"this model's embeddings have {engine.config.hidden_size} dimensions and cannot "
                                f"be shortened to {dims}")
    f.str("user")
    normalize, activation = f.bool("normalize"), f.bool("use_activation")   # vLLM's newer name for normalize
    if None not in (normalize, activation) and normalize != activation:
        raise bad("use_activation", "'use_activation' and 'normalize' disagree: give one of them")
    pooling = pooling_params(f, engine, next((v for v in (activation, normalize) if v is not None), True))
    priority = f.int("priority", 0)
    f.reject_unknown()

    ids = fitted_ids(prompts, pooling, engine, field)
    rid = new_id("embd")
    data = [{"object": "embedding", "index": i, "embedding": _encoded(vec, fmt, dtype, order)}
            for i, vec in enumerate(pooled(state, rid, ids, pooling, priority, gone, field))]
    n = sum(len(p) for p in ids)
    return {"id": rid, "object": "list", "created": int(time.time()), "model": model, "data": data,
            "usage": {"prompt_tokens": n, "total_tokens": n}}


def _chat_prompt(f: Fields, engine) -> list[tuple[list[int], str]]:
    """vLLM's chat embedding request: "messages" rendered by the chat template (add_generation_prompt
    false, add_special_tokens false by default: the template writes them) is the one input."""
    if f.has("input"):
        raise bad("messages", "exactly one of 'input' and 'messages' is required")
    msgs = parse_messages(f.require("messages"))
    text = render_messages(engine, msgs, None, parse_template_fields(f, generation_prompt=False))
    try:
        return [(engine.tokenizer.encode(text, add_special_tokens=f.bool("add_special_tokens", False)), text)]
    except ValueError as e:
        raise bad("messages", str(e)) from None


def pooling_params(f: Fields, engine, normalize: bool = True) -> PoolingParams:
    """The pooling fields of a request: vLLM's "truncate_prompt_tokens", ours "pooling"."""
    truncate = f.int("truncate_prompt_tokens", None, -1)
    pooling_type = f.str("pooling", default_pooling_type(engine.config))
    if pooling_type not in POOLING_TYPES:
        raise bad("pooling", f"'pooling' must be one of {', '.join(map(repr, POOLING_TYPES))}, got {pooling_type!r}")
    try:
        return PoolingParams(pooling_type, normalize, truncate)
    except ValueError as e:   # (truncate_prompt_tokens 0)
        raise from_value_error(e, "truncate_prompt_tokens") from None


def fitted_ids(prompts: list[tuple[list[int], str]], pooling: PoolingParams, engine, field: str) -> list[list[int]]:
    """parse_prompts' prompts as pooled: truncated as pooling says, each checked against the context (which
    a pooled input may fill: nothing is generated after it)."""
    C = engine.max_model_len
    ids = [truncate_prompt(p, pooling.truncate_prompt_tokens, C) for p, _ in prompts]
    for p in ids:
        if len(p) > C:
            raise ApiError(400, f"This model's maximum context length is {C} tokens. However, you requested "
                                f"{len(p)} tokens in the input for embedding generation. Please reduce the length "
                                "of the input.", field, CONTEXT_CODE)
    return ids


def pooled(state, request_id: str, ids: list[list[int]], pooling: PoolingParams, priority: int, gone,
           field: str) -> list[list[float]]:
    """The prompts' embeddings, run as one job of pooling requests."""
    with Job(state, request_id, ids, SamplingParams(max_tokens=1), priority, gone, {"prompt": field},
             pooling=pooling) as job:
        finals = job.results()
    if any(out.embedding is None for out in finals):   # aborted: the server stops
        raise ApiError(503, "the server is shutting down: the embedding was not finished")
    return [out.embedding for out in finals]


def _encoded(embedding: list[float], fmt: str, dtype: str = "float32", order: str = "little"):
    """float: the numbers; base64: their bytes as embed_dtype and endianness say (by default float32,
    little-endian: what OpenAI's clients decode)."""
    if fmt == "float":
        return embedding
    x = np.asarray(embedding, dtype=np.float32)
    if dtype == "bfloat16":   # float32's upper 16 bits, rounded to nearest even
        bits = x.view(np.uint32).astype(np.uint64)
        x = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    else:
        x = x.astype(dtype)
    return base64.b64encode(x.astype(x.dtype.newbyteorder(BYTE_ORDERS[order])).tobytes()).decode("ascii")
