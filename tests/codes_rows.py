"""What the kernel rows of weights kept as codes with scales share (tests/kernel_rows_fp8.py,
tests/kernel_rows_nvfp4.py): the float64 references and the CUDA calls of linear, silu_mul_linear,
concat_rows and get_rows, given a format's upload of a row's inputs and their exact values, and the
rows of the batches past the GEMVs (gemm_codes_tile.cu, and the dequantization + cuBLAS path)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

# fp16 activations (relative rounding 2^-11) into fp32 sums: ~3e-4; past batch 16 the weights are
# rounded to fp16 as well
GEMV_TOL, GEMM_TOL = 1e-3, 2e-3


def x64(inp) -> np.ndarray:
    """The linear's input in float64: x, or silu(x) * up where the row has up."""
    x = inp["x"].astype(np.float64)
    if "up" in inp:
        x = x / (1.0 + np.exp(-x)) * inp["up"].astype(np.float64)
    return x


def with_settings(run: Callable, module: str = "linear_cuda", **settings) -> Callable:
    """run(inp, poison) with a pocketcupy.backend module's settings (e.g. linear_cuda's FP8_UNROLL=2) set
    for the call."""
    def wrapped(inp, poison):
        from pocketcupy.backend.settings import overridden

        with overridden([(module, k, v) for k, v in settings.items()]):
            return run(inp, poison)
    return wrapped


@dataclass(frozen=True)
class CodesFormat:
    qtype: str                          # the CudaWeight's qtype the uploads must keep
    weight: Callable                    # inputs -> CudaWeight (weight_cuda.prepare_weight of their QTensor)
    w64: Callable                       # inputs -> the weight's exact values, float64 [rows, cols]
    split: Callable                     # inputs -> the inputs of three row parts (concat_rows)

    def ref_linear(self, inp):
        y = x64(inp) @ self.w64(inp).T
        return y + inp["bias"] if "bias" in inp else y

    def ref_concat(self, inp):
        return np.concatenate([self.ref_linear(p) for p in self.split(inp)], axis=1)

    def ref_get_rows(self, inp):
        return self.w64(inp)[inp["ids"]]

    def cuda_linear(self, inp, poison):
        import cupy as cp

        from pocketcupy.backend import linear_cuda

        w = self.weight(inp)
        assert w.qtype == self.qtype
        out = poison((inp["x"].shape[0], inp["shape"][0]), np.float32)
        bias = cp.asarray(inp["bias"]) if "bias" in inp else None
        return linear_cuda.linear(cp.asarray(inp["x"]), w, bias, out=out)

    def cuda_silu_mul_linear(self, inp, poison):
        import cupy as cp

        from pocketcupy.backend import linear_cuda

        out = poison((inp["x"].shape[0], inp["shape"][0]), np.float32)
        return linear_cuda.silu_mul_linear(cp.asarray(inp["x"]), cp.asarray(inp["up"]), self.weight(inp), out=out)

    def cuda_concat_rows(self, inp, poison):
        import cupy as cp

        from pocketcupy.backend import linear_cuda, weight_cuda

        w = weight_cuda.concat_rows([self.weight(p) for p in self.split(inp)])
        assert w.qtype == self.qtype and w.shape == inp["shape"]
        out = poison((inp["x"].shape[0], inp["shape"][0]), np.float32)
        return linear_cuda.linear(cp.asarray(inp["x"]), w, None, out=out)

    def cuda_get_rows(self, inp, poison):
        import cupy as cp

        from pocketcupy.backend import linear_cuda

        out = poison((inp["ids"].size, inp["shape"][1]), np.float32)
        return linear_cuda.get_rows(self.weight(inp), cp.asarray(inp["ids"]), out=out)


def gemm_rows(fmt: CodesFormat, make: Callable, rows_out: int, cols: int) -> list:
    """linear past the GEMVs: gemm_codes_tile at each launch shape unsplit (batches 20 and 64: 4 and 8 column
    tiles); split over K in 3 (uneven runs of chunks; a bias, added once) at batch 20, in 8 (the down
    projection's plan) at batch 64, and in 2 over several row blocks at batch 100 (two launches: the split
    counters left at 0 by the first); at its own shape over 40 and 100 rows, with a bias; and dequantization
    + cuBLAS (the tile kernel off: a prefill's path) at batches 17 and 40. make(n, bias=...): a row's inputs."""
    from pocketcupy.backend.codes_tile_cuda import CODES_TILE_SHAPES
    from tests.kernel_table import KernelRow

    name = fmt.qtype.lower()

    def tile(shape, splits):
        return with_settings(fmt.cuda_linear, "codes_tile_cuda", SHAPE_OVERRIDE=shape, SPLITS_OVERRIDE=splits)

    def row_name(shape, splits, n):
        return f"gemm_codes_tile_{name}_{''.join(map(str, shape))}_split{splits}_n{n}-{rows_out}x{cols}"

    rows = [KernelRow("linear", row_name(shape, 1, n), make(n), fmt.ref_linear, tile(shape, 1), GEMM_TOL)
            for shape in CODES_TILE_SHAPES for n in (20, 64)]
    rows += [KernelRow("linear", row_name(shape, splits, n), make(n, bias=True), fmt.ref_linear, tile(shape, splits),
                       GEMM_TOL) for shape, splits, n in ((CODES_TILE_SHAPES[0], 3, 20), (CODES_TILE_SHAPES[0], 8, 64),
                                                        (CODES_TILE_SHAPES[2], 2, 100))]
    rows += [KernelRow("linear", f"gemm_codes_tile_{name}_n{n}-{rows_out}x{cols}", make(n, bias=True),
                       fmt.ref_linear, fmt.cuda_linear, GEMM_TOL) for n in (40, 100)]
    rows += [KernelRow("linear", f"gemm_{name}_dequant_n{n}-{rows_out}x{cols}", make(n, bias=n == 17), fmt.ref_linear,
                       with_settings(fmt.cuda_linear, "codes_tile_cuda", CODES_TILE_MAX_BATCH=0), GEMM_TOL)
             for n in (17, 40)]
    return rows
