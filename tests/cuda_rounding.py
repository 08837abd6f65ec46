"""What the CUDA backend's roundings do to a tiny random model's logits, for its GPU tests against
transformers' fixtures: the CUDA backend rounds the activations of 16-bit weights to the weights'
type (tensor-core GEMVs, cuBLAS), and float32 checkpoints are kept as fp16, so bf16 checkpoints get
bf16 activations and float32 ones fp16. Tiny random models amplify that (hidden 64): where a routed
expert is chosen by a near tie, the choice flips and the logits at that position move a lot. So
the logits are bounded by their median error over positions, which a broken kernel, state or slot
would blow up, and NumPy emulating those roundings (SimulatedCudaRounding, CPU tests) is held to
half of each bound."""
import numpy as np

from pocketcupy.backend.ops_ref import NumpyOps
from pocketcupy.quant.dequant import bf16_to_f32, f32_to_bf16

from .helpers import full_logits
from .seeded_checkpoints import PROMPTS

# median over positions of max |cuda - ref| / max |ref|, by the checkpoint's stored type
MEDIAN_TOL = {"F32": 2.5e-2, "BF16": 6e-2}


def median_error(got, ref) -> float:
    return float(np.median(np.abs(got - ref).max(axis=1)) / np.abs(ref).max())


def prompts_logits(path, ops) -> list[np.ndarray]:
    """Every PROMPTS prompt's logits at every position, of the checkpoint at path on the backend ops."""
    from pocketcupy.loader import load_checkpoint
    from pocketcupy.models.registry import build_model

    ck = load_checkpoint(path)
    model = build_model(ck.config, ck.tensors, ops)
    return [full_logits(model, ops, ids) for ids in PROMPTS]


def backend_error(ref, name: str, folder, ops) -> float:
    """median_error of the checkpoint folder's logits on the backend ops for PROMPTS against variant
    name's in the fixture ref (every position, or the last one)."""
    got, want = [], []
    for k, logits in enumerate(prompts_logits(folder, ops)):
        w = ref[f"{name}__logits{k}"]
        got.append(logits[-len(w):])
        want.append(w)
    return median_error(np.concatenate(got), np.concatenate(want))


class SimulatedCudaRounding(NumpyOps):
    """NumPy with the CUDA backend's roundings: float32 matrices kept as fp16, every linear's
    input rounded to its weight's 16-bit type, K/V pages in fp16."""

    def __init__(self, stored: str):
        super().__init__()
        self.act = np.float16 if stored == "F32" else "bf16"

    def weight(self, t):
        w = super().weight(t)
        return w.astype(np.float16).astype(np.float32) if w.ndim == 2 and t.qtype == "F32" else w

    def linear(self, x, w, bias=None):
        x = np.asarray(x, np.float32)
        if self.act == "bf16":
            x = bf16_to_f32(f32_to_bf16(x))
        else:
            x = x.astype(np.float16).astype(np.float32)
        return super().linear(x, w, bias)

    def paged_attention(self, q, k_cache, v_cache, meta, scale, feeds=None):
        k, v = (c.astype(np.float16).astype(np.float32) for c in (k_cache, v_cache))
        return super().paged_attention(q, k, v, meta, scale, feeds)
