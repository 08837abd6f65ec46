"""Vectorised NumPy versions of llama.cpp's reference K-quant quantizers (ggml-quants.c:
quantize_row_q4_K_ref / q5_K_ref with make_qkx2_quants, quantize_row_q6_K_ref with
make_qx_quants), producing blocks in ggml's exact byte layout.

Every function takes float32 super-blocks `x` shaped (n, 256) and returns uint8 (n, type_size).
Inside, sub-blocks are kept element-major, (sub-block length, n sub-blocks): a sum over a
sub-block is then a row-by-row vector add, which accumulates in the same order as the C loop.
The search over candidate scales walks the same candidates in the same order as the C code
(its state, e.g. the running min of make_qkx2_quants, carries from one candidate to the next),
vectorised across all sub-blocks at once, in float32 with the C expressions' operation order,
so the bytes match llama.cpp's (tests compare against libggml when it is importable).
"""
from __future__ import annotations

import numpy as np

try:  # the clip ufunc itself: np.clip's Python wrapper costs more than the loop on small arrays
    from numpy._core.umath import clip as _clip
except ImportError:  # NumPy 1.x
    from numpy.core.umath import clip as _clip

QK_K = 256
GROUP_MAX_EPS = np.float32(1e-15)
_F32 = np.float32


def f16_bytes(v: np.ndarray) -> np.ndarray:
    """float32 (n,) -> (n, 2) uint8 of the IEEE half (round to nearest even, as ggml)."""
    return np.ascontiguousarray(v, dtype=np.float32).astype(np.float16).view(np.uint8).reshape(-1, 2)


def _f16_round(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).astype(np.float32)


def _wsum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """sum over axis 0 of a*b, products rounded to float32 and added row by row (as a C loop
    `s += a[i]*b[i]`; einsum neither fuses the multiply-add nor reorders the rows)."""
    return np.einsum("ij,ij->j", a, b)


def _sub_blocks(x: np.ndarray, n: int) -> np.ndarray:
    """(nsb, 256) -> element-major (n, nsb*256/n) copy."""
    return np.ascontiguousarray(x.reshape(-1, n).T)


# --------------------------------------------------------------------------------------------
# make_qkx2_quants: scale + min per sub-block (asymmetric), used by Q4_K and Q5_K
# --------------------------------------------------------------------------------------------

def make_qkx2_quants(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    """x, w: element-major (n, B) float32. Returns (scale (B,), the_min (B,) = -min >= 0,
    L (n, B) float32 levels of the winning candidate). Mirrors the C candidate walk, float32
    throughout; sums over axis 0 accumulate row by row, in the C loop's order."""
    mn = np.minimum(x.min(axis=0), _F32(0))
    mx = x.max(axis=0)
    sum_w = w.sum(axis=0)
    sum_x = (w * x).sum(axis=0)
    degenerate = mx == mn
    fnmax = _F32(nmax)
    t = np.empty_like(x)
    tmp = np.empty_like(x)
    wl = np.empty_like(x)

    def levels(iscale, m, out):
        np.subtract(x, m, out=out)
        np.multiply(out, iscale, out=out)
        np.rint(out, out=out)                    # nearest_int: round half to even
        _clip(out, _F32(0), fnmax, out=out)
        return out

    def error(s, m, lv):                         # sum w*(s*L + m - x)^2, as the C loop
        np.multiply(lv, s, out=tmp)
        np.add(tmp, m, out=tmp)
        np.subtract(tmp, x, out=tmp)
        np.multiply(tmp, tmp, out=tmp)
        return _wsum(w, tmp)

    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = (fnmax / np.where(degenerate, _F32(1), mx - mn)).astype(np.float32)
        scale = (_F32(1) / iscale).astype(np.float32)
        best_err = error(scale, mn, levels(iscale, mn, t))
        best_iscale, best_lmin = iscale, mn
        cur_min = mn
        for step in range(nstep + 1):
            num = _F32(rmin) + _F32(rdelta) * _F32(step) + fnmax
            iscale = (num / np.where(degenerate, _F32(1), mx - cur_min)).astype(np.float32)
            lv = levels(iscale, cur_min, t)
            np.multiply(w, lv, out=wl)
            s_l = wl.sum(axis=0)
            s_ll = _wsum(wl, lv)                 # sum (w*l)*l
            s_xl = _wsum(wl, x)                  # sum (w*l)*x
            D = sum_w * s_ll - s_l * s_l
            this_scale = (sum_w * s_xl - sum_x * s_l) / D
            this_min = (s_ll * sum_x - s_l * s_xl) / D
            clamp = this_min > 0
            if clamp.any():
                this_min = np.where(clamp, _F32(0), this_min)
                this_scale = np.where(clamp, s_xl / s_ll, this_scale)
            cur_err = error(this_scale, this_min, lv)
            better = (D > 0) & (cur_err < best_err) & ~degenerate
            if better.any():
                best_err = np.where(better, cur_err, best_err)
                scale = np.where(better, this_scale, scale)
                best_iscale = np.where(better, iscale, best_iscale)
                best_lmin = np.where(better, cur_min, best_lmin)
                cur_min = np.where(better, this_min, cur_min)
    L = levels(best_iscale, best_lmin, t)
    scale = np.where(degenerate, _F32(0), scale).astype(np.float32)
    L[:, degenerate] = 0
    return scale, (-cur_min).astype(np.float32), L


def _k4_scales(scales: np.ndarray, mins: np.ndarray):
    """Per super-block 6-bit quantisation of the 8 sub-block scales and mins (the *_ref path).
    Returns (d f32, dmin f32, ls uint8 (nsb,8), lm uint8 (nsb,8), packed uint8 (nsb,12))."""
    max_scale = np.maximum(scales.max(axis=1), _F32(0))
    max_min = np.maximum(mins.max(axis=1), _F32(0))
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, _F32(63) / max_scale, _F32(0)).astype(np.float32)
        inv_min = np.where(max_min > 0, _F32(63) / max_min, _F32(0)).astype(np.float32)
    # uint8_t ls = nearest_int(...): the int is truncated to 8 bits, then MIN(63, ls)
    ls = np.minimum(np.rint(inv_scale[:, None] * scales).astype(np.int64) & 0xFF, 63).astype(np.uint8)
    lm = np.minimum(np.rint(inv_min[:, None] * mins).astype(np.int64) & 0xFF, 63).astype(np.uint8)
    packed = np.concatenate([
        ls[:, :4] | ((ls[:, 4:] >> 4) << 6),
        lm[:, :4] | ((lm[:, 4:] >> 4) << 6),
        (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4),
    ], axis=1)
    d = (max_scale / _F32(63)).astype(np.float32)
    dmin = (max_min / _F32(63)).astype(np.float32)
    return d, dmin, ls, lm, packed


def _qkx_levels(x: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    """Shared body of Q4_K/Q5_K: returns (d, dmin, packed scales, L (nsb, 256) uint8)."""
    nsb = x.shape[0]
    xs = _sub_blocks(x, 32)                                   # (32, nsb*8)
    av_x = np.sqrt((xs * xs).sum(axis=0) / _F32(32))
    w = av_x + np.abs(xs)
    scales, mins, L0 = make_qkx2_quants(xs, w, nmax, rmin, rdelta, nstep)
    d, dmin, ls, lm, packed = _k4_scales(scales.reshape(nsb, 8), mins.reshape(nsb, 8))
    dq = (_f16_round(d)[:, None] * ls.astype(np.float32)).reshape(-1)      # (nsb*8,)
    dmq = (_f16_round(dmin)[:, None] * lm.astype(np.float32)).reshape(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        L = np.rint((xs + dmq) / dq)
    np.clip(L, 0, nmax, out=L)
    zero = dq == 0
    if zero.any():                                            # `if (!d) continue;` keeps make_qkx2's L
        L[:, zero] = L0[:, zero]
    L = np.ascontiguousarray(L.T).astype(np.uint8).reshape(nsb, QK_K)
    return d, dmin, packed, L


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """(nsb, 256) float32 -> (nsb, 144) uint8 blocks: d, dmin, scales[12], qs[128]."""
    nsb = x.shape[0]
    d, dmin, packed, L = _qkx_levels(x, 15, -1.0, 0.1, 20)
    L = L.reshape(nsb, 4, 2, 32)
    qs = (L[:, :, 0] | (L[:, :, 1] << 4)).reshape(nsb, 128)
    return np.concatenate([f16_bytes(d), f16_bytes(dmin), packed, qs], axis=1)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    """(nsb, 256) float32 -> (nsb, 176) uint8 blocks: d, dmin, scales[12], qh[32], qs[128]."""
    nsb = x.shape[0]
    d, dmin, packed, L = _qkx_levels(x, 31, -0.5, 0.1, 15)
    L = L.reshape(nsb, 4, 2, 32)
    lo = L & 0xF
    qs = (lo[:, :, 0] | (lo[:, :, 1] << 4)).reshape(nsb, 128)
    hi = (L >> 4).astype(np.uint8)                            # (nsb, 4 chunks, 2 halves, 32)
    shifts = (2 * np.arange(4, dtype=np.uint8)[:, None] + np.arange(2, dtype=np.uint8)[None, :])
    qh = np.bitwise_or.reduce((hi << shifts[None, :, :, None]).reshape(nsb, 8, 32), axis=1)
    return np.concatenate([f16_bytes(d), f16_bytes(dmin), packed, qh.astype(np.uint8), qs], axis=1)


# --------------------------------------------------------------------------------------------
# make_qx_quants (rmse_type 1, no importance weights): symmetric scale per sub-block, for Q6_K
# --------------------------------------------------------------------------------------------

def make_qx_quants(x: np.ndarray, nmax: int):
    """x element-major (n, B) float32. Returns (scale (B,) float32, L (n, B) float32 in [0, 2*nmax))."""
    n, nb = x.shape
    ax = np.abs(x)
    amax = ax.max(axis=0)
    idx = ax.argmax(axis=0)                                  # first maximum, as the C loop's strict >
    mx = x[idx, np.arange(nb)]
    zero = amax < GROUP_MAX_EPS
    mx = np.where(zero, _F32(1), mx)
    w = x * x
    wx = w * x
    fnmax = _F32(nmax)
    t = np.empty_like(x)
    tmp = np.empty_like(x)

    def levels(iscale):
        np.multiply(x, iscale, out=t)
        np.rint(t, out=t)
        _clip(t, -fnmax, fnmax - _F32(1), out=t)
        return t

    def sums(lv):
        sumlx = _wsum(wx, lv)                    # sum (w*x)*l
        np.multiply(w, lv, out=tmp)
        suml2 = _wsum(tmp, lv)                   # sum (w*l)*l
        return sumlx, suml2

    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = (-fnmax / mx).astype(np.float32)
        sumlx, suml2 = sums(levels(iscale))
        scale = np.where(suml2 != 0, sumlx / suml2, _F32(0)).astype(np.float32)
        best = scale * sumlx
        best_iscale = iscale
        for step in range(-9, 10):
            if step == 0:
                continue
            iscale = (-(fnmax + _F32(0.1) * _F32(step)) / mx).astype(np.float32)
            sumlx, suml2 = sums(levels(iscale))
            better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            if better.any():
                scale = np.where(better, sumlx / suml2, scale).astype(np.float32)
                best = np.where(better, scale * sumlx, best)
                best_iscale = np.where(better, iscale, best_iscale)
    L = levels(best_iscale) + fnmax
    L[:, zero] = 0
    return np.where(zero, _F32(0), scale).astype(np.float32), L


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """(nsb, 256) float32 -> (nsb, 210) uint8 blocks: ql[128], qh[64], scales[16] int8, d."""
    nsb = x.shape[0]
    xs = _sub_blocks(x, 16)                                   # (16, nsb*16)
    scales, L0 = make_qx_quants(xs, 32)
    scales = scales.reshape(nsb, 16)
    abs_s = np.abs(scales)
    idx = abs_s.argmax(axis=1)
    max_abs = abs_s[np.arange(nsb), idx]
    max_scale = scales[np.arange(nsb), idx]
    zero_blk = max_abs < GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(zero_blk, _F32(0), _F32(-128) / np.where(zero_blk, _F32(1), max_scale)).astype(np.float32)
        d = np.where(zero_blk, _F32(0), _F32(1) / iscale).astype(np.float32)
    sc = np.minimum(np.rint(iscale[:, None] * scales), 127).astype(np.int8)
    sc[zero_blk] = 0
    dq = (_f16_round(d)[:, None] * sc.astype(np.float32)).reshape(-1)     # (nsb*16,)
    with np.errstate(divide="ignore", invalid="ignore"):
        L = np.rint(xs / dq)
    np.clip(L, -32, 31, out=L)
    L += 32
    keep = dq == 0
    if keep.any():
        L[:, keep] = L0[:, keep]
    L = np.ascontiguousarray(L.T).astype(np.uint8).reshape(nsb, 2, 4, 32)  # (half, quarter, l)
    L[zero_blk] = 0
    lo = L & 0xF
    hi = L >> 4
    ql = np.concatenate([lo[:, :, 0] | (lo[:, :, 2] << 4), lo[:, :, 1] | (lo[:, :, 3] << 4)], axis=2)
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)
    return np.concatenate([ql.reshape(nsb, 128), qh.reshape(nsb, 64), sc.view(np.uint8), f16_bytes(d)], axis=1)
