"""CuPy launchers for the small ops: RMSNorm (+ fused residual add), SiLU*up, x*sigmoid(gate), add,
RoPE, the paged KV store, and RoPE fused with the KV store (kernels in cuda_src/norm.cu, act.cu,
rope.cu, kv_store.cu, rope_store.cu).

Activations are float32 cupy arrays. Every launcher takes `out=` and returns it; none reads
device values on the host, so all of them can be captured in a CUDA graph."""
from __future__ import annotations

import functools

import numpy as np

from .kernels import cuda_op, kernel
from .kv_pages_cuda import kv_args
from .pinned_upload import upload

_I32, _I64, _F32 = np.int32, np.int64, np.float32
SILU_MUL4 = True                # SiLU * up 4 columns a thread where the shapes allow (False: the scalar kernel)
SILU_MUL4_GRID_ROWS = 1024      # grid.y of silu_mul4_*: each block's threads take every 1024th row


@functools.lru_cache(maxsize=None)
def _k(filename: str, name: str):
    return kernel(filename, name)


def _cp():
    import cupy

    return cupy


def check_f32(name: str, a) -> None:
    if a.dtype != np.float32:
        raise TypeError(f"{name}: expected float32, got {a.dtype}")


def row_view(a, inner: int):
    """`a` with its last `inner` elements per leading index contiguous; returns (array, row stride)."""
    cp = _cp()
    a = cp.asarray(a)
    flat_ok = a.ndim >= 1 and a.strides[-1] == a.itemsize
    if a.ndim >= 2:
        expect = a.itemsize * a.shape[-1]
        for ax in range(a.ndim - 2, 0, -1):
            flat_ok = flat_ok and a.strides[ax] == expect
            expect *= a.shape[ax]
    if not flat_ok or (a.ndim >= 2 and a.strides[0] % a.itemsize):
        a = cp.ascontiguousarray(a)
    stride = a.strides[0] // a.itemsize if a.ndim >= 2 else inner
    return a, stride


def index_array(a):
    """A device int32/int64 index array (positions, slot mappings)."""
    cp = _cp()
    a = cp.ascontiguousarray(cp.asarray(a))
    if a.dtype not in (np.int32, np.int64):
        a = a.astype(np.int64)
    return a


def _out(out, shape, dtype=np.float32):
    if out is None:
        return _cp().empty(shape, dtype)
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError(f"out: expected a contiguous {np.dtype(dtype)} array of shape {tuple(shape)}, "
                         f"got {out.dtype} {tuple(out.shape)}")
    return out


NORM_WARP_DIMS = (128, 256, 512, 1024)      # rms_norm_warp_f32_d<D>: a warp per row, row in registers
NORM_ROWS_PER_BLOCK = 4


# rms_norm_vec_f32_v<V>: a block per row of at most NORM_VEC_THREADS threads (a multiple of 64, for
# the per-256 quantizer), V (1, 2, 4, 8) float4 a thread. More threads a row, fewer passes: H200,
# Q4_K_M 8B decode graph at batch 4 / 64 (its per-256 norms, 4096 wide: V 1 against 4) 2,352 / 6,616
# us against 2,424 / 6,755 with 256 threads; 512 threads 2,380 at batch 4, 128 threads 2,532.
NORM_VEC_THREADS = 1024


def norm_warp_dim(dim: int) -> int | None:
    """The D of the warp-per-row norm kernels for rows of `dim` values (None: a block per row)."""
    return next((d for d in NORM_WARP_DIMS if dim <= d), None)


def norm_vec_launch(dim: int, *arrays) -> tuple[int, int] | None:
    """(V, threads) of the register-resident block-per-row norm kernels for rows of `dim` values:
    the fewest float4 a thread on at most NORM_VEC_THREADS threads (None: the loop kernels: dim not
    a multiple of 4, an array not 16-byte aligned, or rows too wide)."""
    if dim % 4 or any(a.data.ptr % 16 for a in arrays):
        return None
    threads = min(NORM_VEC_THREADS, -(-dim // 256) * 64)
    v = next((v for v in (1, 2, 4, 8) if dim // 4 <= v * threads), None)
    return None if v is None else (v, threads)


@cuda_op("rms_norm")
def rms_norm(x, w, eps: float, out=None):
    """x [..., dim] float32, w [dim] float32 -> x / rms(x) * w over the last axis (per head for
    [N, H, D] inputs)."""
    cp = _cp()
    check_f32("rms_norm", x)
    x = cp.ascontiguousarray(x)
    w = cp.asarray(w, dtype=np.float32)
    dim = x.shape[-1]
    rows = x.size // dim if dim else 0
    out = _out(out, x.shape)
    if rows == 0:
        return out
    wd = norm_warp_dim(dim)
    if wd is not None:
        rpb = NORM_ROWS_PER_BLOCK
        _k("norm.cu", f"rms_norm_warp_f32_d{wd}")(((rows + rpb - 1) // rpb,), (32 * rpb,),
                                                  (x, w, out, _I32(rows), _I32(dim), _F32(eps)))
    elif (vt := norm_vec_launch(dim, x, w, out)) is not None:
        _k("norm.cu", f"rms_norm_vec_f32_v{vt[0]}")((rows,), (vt[1],), (x, w, out, _I32(dim), _F32(eps)))
    else:
        threads = min(1024, ((dim // 4 + 31) // 32) * 32)
        _k("norm.cu", "rms_norm_f32")((rows,), (threads,), (x, w, out, _I32(dim), _F32(eps)))
    return out


@cuda_op("add_rms_norm")
def add_rms_norm(x, residual, w, eps: float, out=None, residual_out=None):
    """residual_out = x + residual; out = rms_norm(residual_out) * w; returns (out, residual_out).
    residual_out defaults to `residual` itself (updated in place)."""
    cp = _cp()
    check_f32("add_rms_norm", x)
    check_f32("add_rms_norm", residual)
    if not residual.flags.c_contiguous:
        raise ValueError("add_rms_norm: the residual must be contiguous (it is updated in place)")
    x = cp.ascontiguousarray(x)
    w = cp.asarray(w, dtype=np.float32)
    if x.shape != residual.shape:
        raise ValueError(f"add_rms_norm: x {x.shape} and residual {residual.shape} differ")
    dim = x.shape[-1]
    rows = x.size // dim if dim else 0
    out = _out(out, x.shape)
    residual_out = residual if residual_out is None else _out(residual_out, x.shape)
    wd = norm_warp_dim(dim)
    if rows and wd is not None:
        rpb = NORM_ROWS_PER_BLOCK
        _k("norm.cu", f"add_rms_norm_warp_f32_d{wd}")(((rows + rpb - 1) // rpb,), (32 * rpb,),
                                                      (x, residual, w, out, residual_out, _I32(rows), _I32(dim),
                                                       _F32(eps)))
    elif rows and (vt := norm_vec_launch(dim, x, residual, w, out, residual_out)) is not None:
        _k("norm.cu", f"add_rms_norm_vec_f32_v{vt[0]}")(
            (rows,), (vt[1],), (x, residual, w, out, residual_out, _I32(dim), _F32(eps)))
    elif rows:
        threads = min(1024, max(32, ((dim // 4 + 31) // 32) * 32))
        _k("norm.cu", "add_rms_norm_f32")((rows,), (threads,), (x, residual, w, out, residual_out, _I32(dim), _F32(eps)))
    return out, residual_out


def _add_rms_norm_vec_extra(name: str, x, residual, w, eps: float, extra) -> tuple | None:
    """The register-resident add_rms_norm kernel `name` (residual updated in place) with its extra
    output arrays `extra(rows, dim)`: (out, residual, *extra); None where that kernel does not
    apply (dim not a multiple of 32, misaligned arrays, rows too wide)."""
    cp = _cp()
    check_f32(name, x)
    check_f32(name, residual)
    if x.ndim != 2 or x.shape != residual.shape or not residual.flags.c_contiguous:
        raise ValueError(f"{name}: x {x.shape} and a contiguous residual of the same 2-D shape expected")
    x = cp.ascontiguousarray(x)
    w = cp.asarray(w, dtype=np.float32)
    rows, dim = x.shape
    vt = norm_vec_launch(dim, x, residual, w)
    if rows == 0 or dim % 32 or vt is None:
        return None
    out = _out(None, x.shape)
    more = extra(rows, dim)
    _k("norm.cu", f"{name}_vec_f32_v{vt[0]}")(
        (rows,), (vt[1],), (x, residual, w, out, residual, _I32(dim), _F32(eps)) + more)
    return (out, residual) + more


@cuda_op("add_rms_norm_q8")
def add_rms_norm_q8(x, residual, w, eps: float):
    """add_rms_norm (residual updated in place) whose kernel also quantizes the output to int8
    blocks of 32 for int8-activation linears: (out, residual, xq int8 [N, dim], xds float32
    [N, dim / 32, 4]); None where the register-resident kernel does not apply (then call
    add_rms_norm)."""
    cp = _cp()
    return _add_rms_norm_vec_extra("add_rms_norm_q8", x, residual, w, eps, lambda rows, dim: (
        cp.empty((rows, dim), cp.int8), cp.empty((rows, dim // 32, 4), cp.float32)))


@cuda_op("add_rms_norm_q8k")
def add_rms_norm_q8k(x, residual, w, eps: float):
    """add_rms_norm_q8 with the output quantized per 256 values instead (the layout of
    kquant_mma_cuda.quantize_x_q8k, the input of the K-quant tensor-core linears): (out, residual,
    xq int8 [dim / 32, N, 32], xd float32 [N, dim / 256], xb int16 [N, dim / 32]); None where the
    kernel does not apply (also dim not a multiple of 256)."""
    cp = _cp()
    if x.shape[-1] % 256:
        return None
    return _add_rms_norm_vec_extra("add_rms_norm_q8k", x, residual, w, eps, lambda rows, dim: (
        cp.empty((dim // 32, rows, 32), cp.int8), cp.empty((rows, dim // 256), cp.float32), cp.empty((rows, dim // 32), cp.int16)))


@cuda_op("add_rms_norm_h16")
def add_rms_norm_h16(x, residual, w, eps: float, qtype: str):
    """add_rms_norm (residual updated in place) whose kernel also writes the output as 16-bit
    floats, qtype "F16" (float16) or "BF16" (uint16 bits), rounded as linear()'s cast before a
    GEMM over such weights: (out, residual, out16); None where the kernel does not apply."""
    cp = _cp()
    name = {"F16": "add_rms_norm_f16", "BF16": "add_rms_norm_bf16"}[qtype]
    dt = cp.float16 if qtype == "F16" else cp.uint16
    return _add_rms_norm_vec_extra(name, x, residual, w, eps, lambda rows, dim: (cp.empty((rows, dim), dt),))


def _silu_mul4(kernel_name: str, gate, up, out, gate_stride: int, up_stride: int) -> None:
    """A silu_mul4_* launch over [rows, cols] gate / up (row strides in values, all multiples of 4)."""
    rows, cols = gate.shape
    _k("act.cu", kernel_name)(((cols // 4 + 255) // 256, min(rows, SILU_MUL4_GRID_ROWS)), (256,),
                              (gate, up, out, _I32(rows), _I32(cols // 4), _I64(gate_stride // 4),
                               _I64(up_stride // 4)))


def _silu_mul_launch(kernel_name: str, gate, up, out_dtype, out=None):
    check_f32("silu_mul", gate)
    check_f32("silu_mul", up)
    if gate.shape != up.shape:
        raise ValueError(f"silu_mul: gate {gate.shape} and up {up.shape} differ")
    cols = gate.shape[-1]
    gate2, gs = row_view(gate.reshape(-1, cols) if gate.ndim != 2 else gate, cols)
    up2, us = row_view(up.reshape(-1, cols) if up.ndim != 2 else up, cols)
    rows = gate2.shape[0]
    out = _out(out, gate.shape, out_dtype)
    n = rows * cols
    if n == 0:
        return out
    if SILU_MUL4 and cols % 4 == 0 and gs % 4 == 0 and us % 4 == 0 \
            and all(a.data.ptr % 16 == 0 for a in (gate2, up2, out)):
        _silu_mul4(kernel_name.replace("silu_mul_", "silu_mul4_"), gate2, up2, out, gs, us)
    else:
        _k("act.cu", kernel_name)(((n + 255) // 256,), (256,),
                                  (gate2, up2, out, _I32(rows), _I32(cols), _I64(gs), _I64(us)))
    return out


@cuda_op("silu_mul")
def silu_mul(gate, up, out=None):
    """silu(gate) * up for [N, I] float32 (gate/up may be column slices of one [N, 2I] array)."""
    return _silu_mul_launch("silu_mul_f32", gate, up, np.float32, out)


@cuda_op("silu_mul_h16")
def silu_mul_h16(gate, up, qtype: str):
    """silu_mul rounded to 16-bit floats, qtype "F16" (float16) or "BF16" (uint16 bits), as
    linear()'s cast before a GEMM over such weights rounds: that GEMM's input without the float32
    copy."""
    name = {"F16": "silu_mul_f16out", "BF16": "silu_mul_bf16out"}[qtype]
    return _silu_mul_launch(name, gate, up, np.float16 if qtype == "F16" else np.uint16)


@cuda_op("silu_mul_h16in")
def silu_mul_h16in(gate, up, qtype: str, out=None):
    """silu(gate) * up for [N, I] 16-bit gate and up, qtype "F16" (float16) or "BF16" (uint16 bits),
    computed in float32 and rounded back to that type (a gate / up GEMM's 16-bit product in, the
    down projection's GEMM input out). Needs I and both row strides a multiple of 4 and 8-byte
    aligned rows (column views of one [N, 2I] product qualify)."""
    dt = np.dtype(np.float16 if qtype == "F16" else np.uint16)
    if gate.dtype != dt or up.dtype != dt or gate.shape != up.shape or gate.ndim != 2:
        raise ValueError(f"silu_mul_h16in: gate and up must be [N, I] {dt} arrays of one shape for {qtype}, "
                         f"got {gate.dtype} {gate.shape} and {up.dtype} {up.shape}")
    rows, cols = gate.shape
    gs, us = gate.strides[0] // 2, up.strides[0] // 2
    if cols % 4 or gs % 4 or us % 4 or gate.strides[1] != 2 or up.strides[1] != 2 \
            or gate.data.ptr % 8 or up.data.ptr % 8:
        raise ValueError("silu_mul_h16in: columns and row strides must be multiples of 4 values, rows 8-byte aligned")
    out = _out(out, gate.shape, dt)
    if rows and cols:
        _silu_mul4("silu_mul4_f16in" if qtype == "F16" else "silu_mul4_bf16in", gate, up, out, gs, us)
    return out


@cuda_op("sigmoid_mul")
def sigmoid_mul(gate, x, out=None):
    """x * sigmoid(gate) for x [N, C] float32 and gate [N, C] or [N, 1] (one gate a row); either may
    be a column view of a wider array."""
    check_f32("sigmoid_mul", gate)
    check_f32("sigmoid_mul", x)
    rows, cols = x.shape
    if gate.shape not in ((rows, cols), (rows, 1)):
        raise ValueError(f"sigmoid_mul: gate {gate.shape} is neither x's shape {x.shape} nor ({rows}, 1)")
    gate, gs = row_view(gate, gate.shape[1])
    x, xs = row_view(x, cols)
    out = _out(out, (rows, cols))
    if rows and cols:
        _k("act.cu", "sigmoid_mul_f32")(((rows * cols + 255) // 256,), (256,),
                                        (gate, _I64(gs), _I32(gate.shape[1]), x, _I64(xs), out, _I32(rows),
                                         _I32(cols)))
    return out


@cuda_op("add")
def add(a, b, out=None):
    """a + b, float32, same shapes."""
    cp = _cp()
    check_f32("add", a)
    check_f32("add", b)
    if a.shape != b.shape:
        raise ValueError(f"add: shapes {a.shape} and {b.shape} differ")
    a, b = cp.ascontiguousarray(a), cp.ascontiguousarray(b)
    out = _out(out, a.shape)
    if a.size:
        _k("act.cu", "add_f32")(((a.size + 255) // 256,), (256,), (a, b, out, _I64(a.size)))
    return out


@cuda_op("rope")
def rope(x, positions, inv_freq, interleaved: bool, out=None):
    """x [N, H, D] float32; rotates the first 2 * len(inv_freq) dims of each head by positions [N].
    out may be x (in place); by default a new array."""
    check_f32("rope", x)
    n, h, d = x.shape
    rot_half = int(inv_freq.shape[0])
    if 2 * rot_half > d or d % 2:
        raise ValueError(f"rope: {rot_half} frequencies do not fit head_dim {d}")
    inplace = out is x
    x, xs = row_view(x, h * d)
    inv_freq = _cp().asarray(inv_freq, dtype=np.float32)
    positions = index_array(positions)
    if inplace:
        if out is not x:
            raise ValueError("rope: in place needs x with each token's heads contiguous")
        os_ = xs
    else:
        out, os_ = _out(out, x.shape), h * d
    if n:
        name = ("rope_interleaved_f32" if interleaved else "rope_halves_f32") + \
            ("_pos32" if positions.dtype == np.int32 else "_pos64")
        _k("rope.cu", name)((n,), (128,), (x, out, positions, inv_freq, _I32(n), _I32(h), _I32(d), _I32(rot_half),
                                            _I64(xs), _I64(os_)))
    return out


@cuda_op("store_kv")
def store_kv(k_cache, v_cache, k, v, slot_mapping):
    """Writes k, v [N, Hkv, D] float32 into the caches [blocks, block_size, Hkv, D] at slot_mapping
    [N] (int32/int64; negative = skip): fp16 pages, or int8 / fp8 / k8v4 codes, a warp quantizing each row."""
    check_f32("store_kv", k)
    check_f32("store_kv", v)
    n, hkv, d = k.shape
    if tuple(k_cache.shape[2:]) != (hkv, d) or v.shape != k.shape:
        raise ValueError(f"store_kv: k {k.shape} / v {v.shape} do not match the cache {k_cache.shape}")
    kv = kv_args("store_kv", k_cache, v_cache)
    k, ks = row_view(k, hkv * d)
    v, vs = row_view(v, hkv * d)
    slots = index_array(slot_mapping)
    if n:
        name = f"store_kv_{kv.tag}_slot{32 if slots.dtype == np.int32 else 64}"
        if kv.tag == "f16":
            args = (k, v, k_cache, v_cache, slots, _I32(n), _I32(hkv * d), _I64(ks), _I64(vs))
        else:
            args = (k, v, *kv.code_arrays, slots, _I32(n), _I32(hkv), _I32(d), _I64(ks), _I64(vs))
        _k("kv_store.cu", name)((n,), (128,), args)
    return k_cache, v_cache


ROPE_MAX_HALF = 128                          # rope_store.cu
ROPE_STORE_THREADS = 256
ROPE_STORE_MIN_BLOCKS = 264                  # small batches: a token's items spread over blocks (2 per SM of an H200)


@cuda_op("rope_store_kv")
def rope_store_kv(q, k, v, positions, inv_freq, interleaved: bool, k_cache, v_cache, slot_mapping, out=None):
    """RoPE on q [N, Hq, D] and k [N, Hkv, D] (float32; each token's heads contiguous, e.g. column
    views of a fused QKV output), rotated k and v written to the caches (fp16, or int8 / fp8 / k8v4 codes)
    at slot_mapping [N] (negative: not stored). Returns the rotated q, [N, Hq, D] contiguous (out=
    if given)."""
    check_f32("rope_store_kv", q)
    check_f32("rope_store_kv", k)
    check_f32("rope_store_kv", v)
    n, hq, d = q.shape
    hkv = k.shape[1]
    rot_half = int(inv_freq.shape[0])
    if 2 * rot_half > d or d % 2 or rot_half > ROPE_MAX_HALF:
        raise ValueError(f"rope_store_kv: {rot_half} frequencies do not fit head_dim {d}")
    if k.shape != (n, hkv, d) or v.shape != k.shape or tuple(k_cache.shape[2:]) != (hkv, d):
        raise ValueError(f"rope_store_kv: q {q.shape}, k {k.shape}, v {v.shape} do not match the cache {k_cache.shape}")
    kv = kv_args("rope_store_kv", k_cache, v_cache)
    q, qs = row_view(q, hq * d)
    k, ks = row_view(k, hkv * d)
    v, vs = row_view(v, hkv * d)
    positions, slots = index_array(positions), index_array(slot_mapping)
    inv_freq = _cp().asarray(inv_freq, dtype=np.float32)
    out = _out(out, (n, hq, d))
    if n:
        name = (f"rope_store_kv_{'interleaved' if interleaved else 'halves'}_{kv.tag}"
                f"_pos{32 if positions.dtype == np.int32 else 64}_slot{32 if slots.dtype == np.int32 else 64}")
        # one token's q pairs, then k pairs and v values (fp16) or a warp per K and V row (codes)
        items = hq * d // 2 + (hkv * d // 2 + hkv * d if kv.tag == "f16" else 2 * hkv * 32)
        per_token = max(1, min(-(-items // ROPE_STORE_THREADS), max(1, ROPE_STORE_MIN_BLOCKS // n)))
        caches = (k_cache, v_cache) if kv.tag == "f16" else kv.code_arrays
        _k("rope_store.cu", name)((n, per_token), (ROPE_STORE_THREADS,),
                                  (q, _I64(qs), k, _I64(ks), v, _I64(vs), positions, inv_freq, slots, out, *caches,
                                   _I32(n), _I32(hq), _I32(hkv), _I32(d), _I32(rot_half)))
    return out


@cuda_op("scatter_tokens")
def scatter_tokens(ids, dst_rows, tokens, src_rows) -> None:
    """ids[dst_rows] = tokens[src_rows] in place: ids a contiguous device int64 array; tokens the
    sampler's device int32 ids (a strided column allowed); the row lists are host integers."""
    n = len(dst_rows)
    if ids.dtype != np.int64 or not ids.flags.c_contiguous or tokens.dtype != np.int32 or tokens.ndim != 1:
        raise TypeError(f"scatter_tokens: ids must be contiguous int64 and tokens int32 [B], got {ids.dtype}, "
                        f"{tokens.dtype} {tokens.shape}")
    if n != len(src_rows):
        raise ValueError(f"scatter_tokens: {n} destination rows for {len(src_rows)} source rows")
    if n == 0:
        return
    rows = upload(np.asarray([*dst_rows, *src_rows], np.int32))
    _k("tokens.cu", "scatter_tokens")(((n + 127) // 128,), (128,),
                                      (tokens, _I64(tokens.strides[0] // 4), rows, _I32(n), ids))


def feed_row_count(top: int) -> int:
    """int64 words of a decode graph's feed buffer for top rows (see tokens.cu feed_tokens)."""
    return 2 + top


def fill_feed(feed: np.ndarray, n: int, fed=None) -> None:
    """The host side of feed_tokens for rows < n. fed: (dst rows, tokens, src rows) as for
    scatter_tokens, or None; rows not in dst rows keep their uploaded id."""
    feed[2:2 + n] = -1
    if fed is not None and len(fed[0]):
        dst_rows, tokens, src_rows = fed
        feed[0], feed[1] = tokens.data.ptr, tokens.strides[0] // 4
        feed[2 + np.asarray(dst_rows, np.int64)] = src_rows


@cuda_op("feed_tokens")
def feed_tokens(feed, n: int, ids) -> None:
    """ids[i] = tokens[feed[2 + i]] for rows i < n that name one (fill_feed), on the device: the
    launch a decode graph captures, so the sampled ids' address travels in feed, not as an argument."""
    if ids.dtype != np.int64 or feed.dtype != np.int64 or len(feed) < feed_row_count(n) or len(ids) < n:
        raise TypeError(f"feed_tokens: feed int64 [>= {feed_row_count(n)}] and ids int64 [>= {n}], got "
                        f"{feed.dtype} {feed.shape}, {ids.dtype} {ids.shape}")
    _k("tokens.cu", "feed_tokens")(((n + 127) // 128,), (128,), (feed, _I32(n), ids))
