"""Shared test helpers: run a model's forward pass directly over one sequence, or steps of several
sequences over a paged cache; load a script of scripts/ as a module; a step's top-two log-prob margin."""
import importlib.util
import os
import sys

import numpy as np

from pocketcupy.backend.attention_meta import AttentionMetadata
from pocketcupy.backend.ops_ref import NumpyOps
from pocketcupy.loader import load_checkpoint
from pocketcupy.models.registry import build_model
from pocketcupy.sched.output import ScheduledRequest, SchedulerOutput
from pocketcupy.state_slots import StateSlots


def load_reference_model(path):
    ck = load_checkpoint(path)
    ops = NumpyOps()
    return build_model(ck.config, ck.tensors, ops), ops


def full_logits(model, ops, ids, block_size=16, kv_cache_dtype="auto"):
    """Logits at every position of `ids`, computed in one prefill pass (a hybrid model's recurrent
    state in one state slot)."""
    return ops.to_host(model.compute_logits(full_hidden(model, ops, ids, block_size, kv_cache_dtype)))


def full_hidden(model, ops, ids, block_size=16, kv_cache_dtype="auto"):
    """The final hidden states (after the last norm) at every position of `ids`, on the backend, as
    full_logits computes them."""
    c, n = model.config, len(ids)
    nblk = -(-n // block_size)
    caches = [ops.empty_kv_cache(nblk, block_size, c.num_kv_heads, c.head_dim, kv_cache_dtype)
              for _ in range(c.num_kv_layers)]
    meta = AttentionMetadata(np.array([0, n], np.int32), np.array([n], np.int32),
                             np.arange(nblk, dtype=np.int32)[None], np.arange(n), block_size)
    shapes = getattr(model, "state_shapes", None)
    states = () if shapes is None else (StateSlots(ops, shapes, 1),)
    for slots in states:
        slots.prepare(SchedulerOutput([ScheduledRequest("seq", list(ids), 0, [], True, False)]))
    return model.forward(np.asarray(ids, np.int64), np.arange(n), meta, caches, *states)


def load_script(name: str):
    """scripts/<name>.py as a module, loaded once and registered under its name: dataclasses look
    their module up, and a worker process gets its functions by that name (a second copy's would
    not pickle: make_synthetic_model's pool failed, or hung, in the second test loading it)."""
    if name in sys.modules:
        return sys.modules[name]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[name]
        raise
    return mod


def write_safetensors(path, tensors: dict) -> None:
    """A safetensors file of {name: (safetensors dtype, array)}: the arrays' bytes as they are
    (BF16 as uint16 bits, F8_E4M3 and U8 as uint8 codes), which NumPy alone cannot name."""
    import json

    header, chunks, offset = {}, [], 0
    for name, (dtype, a) in tensors.items():
        data = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dtype, "shape": list(np.shape(a)), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(chunks))


def rel_err(got, ref) -> float:
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def logprob_margin(lp: dict) -> float:
    """The gap between the top two log-probs of one step's logprobs dict (a near-tie when small)."""
    top = sorted((x.logprob for x in lp.values()), reverse=True)
    return top[0] - top[1]


class PagedRun:
    """Runs forward steps of several sequences over one paged cache with shuffled block ids."""

    def __init__(self, model, ops, num_blocks=12, seed=0, block=16):
        c = model.config
        self.model, self.ops, self.block = model, ops, block
        self.caches = [ops.empty_kv_cache(num_blocks, block, c.num_kv_heads, c.head_dim) for _ in range(c.num_layers)]
        self.free = list(np.random.default_rng(seed).permutation(num_blocks))
        self.tables: dict[str, list[int]] = {}

    def step(self, chunks, decode_only=False):
        """chunks: [(seq name, token ids, start position)] -> host logits of every row."""
        ids, pos, slots, starts, lens, tables = [], [], [], [0], [], []
        for name, toks, start in chunks:
            stop = start + len(toks)
            table = self.tables.setdefault(name, [])
            while len(table) * self.block < stop:
                table.append(int(self.free.pop()))
            p = np.arange(start, stop)
            ids.extend(int(t) for t in toks)
            pos.append(p)
            slots.append(np.asarray(table, np.int64)[p // self.block] * self.block + p % self.block)
            starts.append(starts[-1] + len(toks))
            lens.append(stop)
            tables.append(table)
        bt = np.zeros((len(chunks), max(len(t) for t in tables) + 1), np.int32)
        for i, t in enumerate(tables):
            bt[i, :len(t)] = t
        meta = AttentionMetadata(np.asarray(starts, np.int32), np.asarray(lens, np.int32), bt, np.concatenate(slots),
                                 self.block, decode_only=decode_only)
        ops = self.ops
        hidden = self.model.forward(ops.asarray(np.asarray(ids, np.int64)), ops.asarray(np.concatenate(pos)),
                                    ops.upload_meta(meta), self.caches)
        logits = ops.to_host(self.model.compute_logits(hidden))
        return np.split(logits, starts[1:-1])
