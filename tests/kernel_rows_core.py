"""Kernel-table rows for the core ops: norms, activations, RoPE, KV store (attention rows are in
kernel_rows_attn.py)."""
import functools

import numpy as np

from pocketcupy.backend.attention_meta import AttentionMetadata
from pocketcupy.backend.ops_ref import NumpyOps
from pocketcupy.quant.dequant import f32_to_bf16

from .kernel_table import KernelRow, q8_blocks_dequantized, q8k_blocks_dequantized

REF = NumpyOps()
F32 = np.float32


def _cp():
    import cupy

    return cupy


def _up(a):
    return _cp().asarray(a)


def _randn(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(F32)


def _ew():
    from pocketcupy.backend import elementwise_cuda

    return elementwise_cuda


def _norm_w(rng, d):
    return (1.0 + 0.1 * rng.standard_normal(d)).astype(F32)


ROWS = []

# --- RMSNorm ----------------------------------------------------------------------------------
for shape in [(5, 4096), (3, 576), (7, 64), (2, 2050), (9, 8, 128), (4, 16, 64), (6, 2, 32), (5, 200), (3, 384),
              (2, 1024), (1, 1025), (3, 8192), (2, 5120), (1, 2048)]:
    def make(rng, shape=shape):
        return {"x": _randn(rng, *shape, scale=2.0), "w": _norm_w(rng, shape[-1]), "eps": 1e-6}

    ROWS.append(KernelRow(
        "rms_norm", "x".join(map(str, shape)), make,
        ref=lambda i: REF.rms_norm(i["x"], i["w"], i["eps"]),
        cuda=lambda i, poison: _ew().rms_norm(_up(i["x"]), _up(i["w"]), i["eps"], out=poison(i["x"].shape, F32))))

def _add_norm_case(rng, shape):
    """Inputs of the residual-add + RMSNorm rows."""
    return {"x": _randn(rng, *shape), "res": _randn(rng, *shape, scale=3.0), "w": _norm_w(rng, shape[-1]), "eps": 1e-5}


for shape, inplace in [((4, 4096), False), ((3, 576), True), ((1, 64), False), ((2, 2050), True), ((5, 1024), False),
                       ((9, 300), True), ((2, 130), False), ((1, 576), True), ((2, 7168), True), ((1, 2048), False)]:
    make = functools.partial(_add_norm_case, shape=shape)

    def cuda(i, poison, inplace=inplace):
        res = _up(i["res"])
        out, res_out = _ew().add_rms_norm(_up(i["x"]), res, _up(i["w"]), i["eps"], out=poison(i["x"].shape, F32),
                                          residual_out=None if inplace else poison(i["x"].shape, F32))
        assert (res_out is res) == inplace
        return out, res_out

    ROWS.append(KernelRow("add_rms_norm", "x".join(map(str, shape)) + ("-inplace" if inplace else ""), make,
                          ref=lambda i: REF.add_rms_norm(i["x"], i["res"], i["w"], i["eps"]), cuda=cuda))

# --- add_rms_norm with the output quantized to int8 blocks (the int8-activation linears' input) ---
for shape in [(1, 4096), (3, 2048), (2, 8192), (5, 1024)]:
    make = functools.partial(_add_norm_case, shape=shape)

    def ref(i):
        from pocketcupy.quant.act_q8 import q8_roundtrip

        out, res = REF.add_rms_norm(i["x"], i["res"], i["w"], i["eps"])
        return out, res, q8_roundtrip(out)

    def cuda(i, poison):
        """(out, residual, the int8 blocks dequantized); the blocks' sums checked against their values.
        Tolerance: an ulp of difference in out can move one value by a whole int8 step (~4e-4 here)."""
        res = _up(i["res"])
        out, res_out, xq, xds = _ew().add_rms_norm_q8(_up(i["x"]), res, _up(i["w"]), i["eps"])
        assert res_out is res
        return out, res_out, q8_blocks_dequantized(xq, xds)

    ROWS.append(KernelRow("add_rms_norm_q8", "x".join(map(str, shape)), make, ref=ref, cuda=cuda, tol=2e-3))

# --- the same quantized per 256 values (the K-quant tensor-core linears' input); 4096: several
# super-blocks per thread column, 1280: a partial last pass of the block's threads ---
for shape in [(1, 4096), (3, 1280), (2, 8192)]:
    make = functools.partial(_add_norm_case, shape=shape)

    def ref(i):
        from pocketcupy.quant.act_q8 import q8k_roundtrip

        out, res = REF.add_rms_norm(i["x"], i["res"], i["w"], i["eps"])
        return out, res, q8k_roundtrip(out)

    def cuda(i, poison):
        res = _up(i["res"])
        out, res_out, *xk = _ew().add_rms_norm_q8k(_up(i["x"]), res, _up(i["w"]), i["eps"])
        assert res_out is res
        return out, res_out, q8k_blocks_dequantized(*xk)

    ROWS.append(KernelRow("add_rms_norm_q8k", "x".join(map(str, shape)), make, ref=ref, cuda=cuda, tol=2e-3))

# --- add_rms_norm with a 16-bit copy of the output (the input of GEMMs over fp16 / bf16 weights) --
def round16(x, qtype: str) -> np.ndarray:
    """float32 -> its fp16 / bf16 rounding (nearest even), as float32."""
    if qtype == "F16":
        return x.astype(np.float16).astype(F32)
    u = np.ascontiguousarray(x, F32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(F32)


def widen16(x16, qtype: str):
    """The CUDA side's fp16 array / bf16 bits (uint16) as float32."""
    cp = _cp()
    return x16.astype(cp.float32) if qtype == "F16" else (x16.astype(cp.uint32) << 16).view(cp.float32)


for qtype, shape in [("BF16", (40, 4096)), ("F16", (33, 1024)), ("BF16", (9, 8192))]:
    make = functools.partial(_add_norm_case, shape=shape)

    def ref(i, qtype=qtype):
        out, res = REF.add_rms_norm(i["x"], i["res"], i["w"], i["eps"])
        return out, res, round16(out, qtype)

    def cuda(i, poison, qtype=qtype):
        res = _up(i["res"])
        out, res_out, x16 = _ew().add_rms_norm_h16(_up(i["x"]), res, _up(i["w"]), i["eps"], qtype)
        assert res_out is res
        return out, res_out, widen16(x16, qtype)

    ROWS.append(KernelRow("add_rms_norm_h16", f"{qtype.lower()}-" + "x".join(map(str, shape)), make, ref=ref,
                          cuda=cuda, tol=1e-4))

# --- SiLU * up, add ---------------------------------------------------------------------------
# 4 columns a thread (silu_mul4_*) where cols and the strides allow, 1030 rows past its grid's 1024;
# else (350 columns) the scalar kernel
for rows_, cols, fused in [(6, 1536, False), (3, 352, True), (1, 14336, False), (1030, 36, True), (5, 350, True)]:
    def make(rng, rows_=rows_, cols=cols):
        return {"gu": _randn(rng, rows_, 2 * cols, scale=3.0)}

    def cuda(i, poison, cols=cols, fused=fused):
        gu = _up(i["gu"])
        gate, up = gu[:, :cols], gu[:, cols:]
        if not fused:
            gate, up = _cp().ascontiguousarray(gate), _cp().ascontiguousarray(up)
        return _ew().silu_mul(gate, up, out=poison(gate.shape, F32))

    ROWS.append(KernelRow("silu_mul", f"{rows_}x{cols}" + ("-views" if fused else ""), make,
                          ref=lambda i, cols=cols: REF.silu_mul(i["gu"][:, :cols], i["gu"][:, cols:]), cuda=cuda))

for qtype, rows_, cols, fused in [("BF16", 40, 1536, True), ("F16", 9, 352, False), ("BF16", 1030, 20, False),
                                  ("F16", 3, 350, True)]:
    def make(rng, rows_=rows_, cols=cols):
        return {"gu": _randn(rng, rows_, 2 * cols, scale=3.0)}

    def cuda(i, poison, cols=cols, fused=fused, qtype=qtype):
        gu = _up(i["gu"])
        gate, up = gu[:, :cols], gu[:, cols:]
        if not fused:
            gate, up = _cp().ascontiguousarray(gate), _cp().ascontiguousarray(up)
        return widen16(_ew().silu_mul_h16(gate, up, qtype), qtype)

    ROWS.append(KernelRow("silu_mul_h16", f"{qtype.lower()}-{rows_}x{cols}" + ("-views" if fused else ""), make,
                          ref=lambda i, cols=cols, qtype=qtype: round16(
                              REF.silu_mul(i["gu"][:, :cols], i["gu"][:, cols:]), qtype), cuda=cuda, tol=1e-4))


def bits16(x, qtype: str):
    """float32 -> the CUDA side's fp16 values / bf16 bits (uint16), rounded to nearest even."""
    return x.astype(np.float16) if qtype == "F16" else f32_to_bf16(x)


# 16-bit inputs (a gate / up GEMM's product): 1030 rows past the grid's 1024
for qtype, rows_, cols, fused in [("BF16", 40, 1536, True), ("F16", 9, 352, False), ("BF16", 1030, 20, True)]:
    def make(rng, rows_=rows_, cols=cols):
        return {"gu": _randn(rng, rows_, 2 * cols, scale=3.0)}

    def cuda(i, poison, cols=cols, fused=fused, qtype=qtype):
        gu = _up(bits16(i["gu"], qtype))
        gate, up = gu[:, :cols], gu[:, cols:]
        if not fused:
            gate, up = _cp().ascontiguousarray(gate), _cp().ascontiguousarray(up)
        out = poison(gate.shape, gu.dtype)
        return widen16(_ew().silu_mul_h16in(gate, up, qtype, out=out), qtype)

    def ref(i, cols=cols, qtype=qtype):
        gu = round16(i["gu"], qtype)
        return round16(REF.silu_mul(gu[:, :cols], gu[:, cols:]), qtype)

    ROWS.append(KernelRow("silu_mul_h16in", f"{qtype.lower()}-{rows_}x{cols}" + ("-views" if fused else ""), make,
                          ref=ref, cuda=cuda, tol=1e-4))

for shape in [(1000,), (5, 4096)]:
    ROWS.append(KernelRow(
        "add", "x".join(map(str, shape)), lambda rng, shape=shape: {"a": _randn(rng, *shape), "b": _randn(rng, *shape)},
        ref=lambda i: i["a"] + i["b"],
        cuda=lambda i, poison: _ew().add(_up(i["a"]), _up(i["b"]), out=poison(i["a"].shape, F32))))


# --- RoPE -------------------------------------------------------------------------------------
def _inv_freq(rot, theta=10000.0):
    return (1.0 / theta ** (np.arange(0, rot, 2, dtype=np.float32) / rot)).astype(F32)


for n, h, d, rot, interleaved, pos_dtype, inplace in [
        (7, 4, 64, 64, False, np.int64, False), (5, 3, 128, 64, True, np.int32, False),
        (3, 32, 128, 128, False, np.int32, True), (4, 2, 128, 32, False, np.int64, False),
        (6, 4, 16, 16, True, np.int64, True), (2, 8, 32, 32, False, np.int64, False)]:
    def make(rng, n=n, h=h, d=d, rot=rot, pos_dtype=pos_dtype):
        return {"x": _randn(rng, n, h, d), "pos": rng.integers(0, 4096, n).astype(pos_dtype), "inv": _inv_freq(rot)}

    def cuda(i, poison, interleaved=interleaved, inplace=inplace):
        x = _up(i["x"])
        out = x if inplace else poison(x.shape, F32)
        got = _ew().rope(x, _up(i["pos"]), _up(i["inv"]), interleaved, out=out)
        assert got is out
        return got

    ROWS.append(KernelRow(
        "rope", f"{'interleaved' if interleaved else 'halves'}-{n}x{h}x{d}-rot{rot}-{np.dtype(pos_dtype).name}"
        + ("-inplace" if inplace else ""), make,
        ref=lambda i, interleaved=interleaved: REF.rope(i["x"], i["pos"], i["inv"], interleaved), cuda=cuda))


# --- KV store ---------------------------------------------------------------------------------
for n, hkv, d, slot_dtype, fused in [(5, 2, 64, np.int64, False), (3, 8, 128, np.int32, True), (9, 1, 16, np.int32, False)]:
    def make(rng, n=n, hkv=hkv, d=d, slot_dtype=slot_dtype):
        nb, bs = 4, 16
        slots = rng.choice(nb * bs, n, replace=False).astype(slot_dtype)
        slots[n // 2] = -1                       # padding row: not written
        return {"qkv": _randn(rng, n, (4 + 2) * hkv * d), "slots": slots,
                "kc": _randn(rng, nb, bs, hkv, d).astype(np.float16), "vc": _randn(rng, nb, bs, hkv, d).astype(np.float16)}

    def split_kv(qkv, hkv, d):
        n = qkv.shape[0]
        k = qkv[:, 4 * hkv * d:5 * hkv * d].reshape(n, hkv, d)
        return k, qkv[:, 5 * hkv * d:].reshape(n, hkv, d)

    def ref(i, hkv=hkv, d=d):
        k, v = split_kv(i["qkv"], hkv, d)
        keep = i["slots"] >= 0
        kc, vc = i["kc"].reshape(-1, hkv, d), i["vc"].reshape(-1, hkv, d)
        kc[i["slots"][keep]], vc[i["slots"][keep]] = k[keep], v[keep]
        return i["kc"], i["vc"]

    def cuda(i, poison, hkv=hkv, d=d, fused=fused):
        k, v = split_kv(_up(i["qkv"]), hkv, d)
        if not fused:
            k, v = _cp().ascontiguousarray(k), _cp().ascontiguousarray(v)
        kc, vc = _up(i["kc"]), _up(i["vc"])
        _ew().store_kv(kc, vc, k, v, _up(i["slots"]))
        return kc, vc

    ROWS.append(KernelRow("store_kv", f"n{n}-hkv{hkv}-d{d}-{np.dtype(slot_dtype).name}" + ("-views" if fused else ""),
                          make, ref=ref, cuda=cuda, tol=0.0))


# --- RoPE + KV store in one kernel --------------------------------------------------------------
# (n, hq, hkv, d, rot, interleaved, pos dtype, slot dtype, fused: q/k/v column views of one QKV row)
ROPE_STORE = [(1, 9, 3, 64, 64, True, np.int64, np.int64, True), (5, 4, 2, 64, 64, False, np.int32, np.int32, False),
              (3, 8, 2, 128, 64, False, np.int64, np.int32, True), (6, 4, 4, 32, 32, True, np.int32, np.int64, False),
              (4, 32, 8, 128, 128, False, np.int64, np.int64, True)]
for n, hq, hkv, d, rot, interleaved, pos_dtype, slot_dtype, fused in ROPE_STORE:
    def make(rng, n=n, hq=hq, hkv=hkv, d=d, rot=rot, pos_dtype=pos_dtype, slot_dtype=slot_dtype):
        nb, bs = 4, 16
        slots = rng.choice(nb * bs, n, replace=False).astype(slot_dtype)
        if n > 1:
            slots[n // 2] = -1                   # padding row: q rotated, nothing stored
        cache = [_randn(rng, nb, bs, hkv, d).astype(np.float16) for _ in range(2)]
        return {"qkv": _randn(rng, n, (hq + 2 * hkv) * d), "pos": rng.integers(0, 4096, n).astype(pos_dtype),
                "inv": _inv_freq(rot), "slots": slots, "kc": cache[0], "vc": cache[1]}

    def split_qkv(qkv, hq, hkv, d):
        n = qkv.shape[0]
        return (qkv[:, :hq * d].reshape(n, hq, d), qkv[:, hq * d:(hq + hkv) * d].reshape(n, hkv, d),
                qkv[:, (hq + hkv) * d:].reshape(n, hkv, d))

    def ref(i, hq=hq, hkv=hkv, d=d, interleaved=interleaved):
        q, k, v = split_qkv(i["qkv"], hq, hkv, d)
        keep = i["slots"] >= 0
        kc, vc = i["kc"], i["vc"]
        REF.rope_store_kv(q[keep], k[keep], v[keep], i["pos"][keep], i["inv"], interleaved, kc, vc, i["slots"][keep])
        return REF.rope(q, i["pos"], i["inv"], interleaved), kc, vc    # q of the padding row is rotated too

    def cuda(i, poison, hq=hq, hkv=hkv, d=d, interleaved=interleaved, fused=fused):
        q, k, v = split_qkv(_up(i["qkv"]), hq, hkv, d)
        if not fused:
            q, k, v = (_cp().ascontiguousarray(a) for a in (q, k, v))
        kc, vc = _up(i["kc"]), _up(i["vc"])
        out = poison(q.shape, F32)
        got = _ew().rope_store_kv(q, k, v, _up(i["pos"]), _up(i["inv"]), interleaved, kc, vc, _up(i["slots"]), out=out)
        assert got is out
        return got, kc, vc

    ROWS.append(KernelRow(
        "rope_store_kv", f"{'interleaved' if interleaved else 'halves'}-n{n}-hq{hq}-hkv{hkv}-d{d}-rot{rot}-"
        f"pos{np.dtype(pos_dtype).itemsize * 8}-slot{np.dtype(slot_dtype).itemsize * 8}" + ("-views" if fused else ""),
        make, ref=ref, cuda=cuda, tol=1e-3))


# --- CudaOps.paged_attention (the cache already holds the new tokens) ---------------------------
def _paged_case(seqs, hkv, group, d, decode_only):
    def make(rng):
        from .kernel_rows_attn import make_case

        i = make_case(rng, seqs, hkv, group, d)
        i["meta"].decode_only = decode_only
        return i
    return make


def _paged_ref(i):
    from .kernel_rows_attn import stored_caches

    kc, vc = stored_caches(i)
    return REF.paged_attention(i["q"], kc.astype(F32), vc.astype(F32), i["meta"], i["scale"])


def _paged_cuda(i, poison):
    from pocketcupy.backend.ops_cuda import CudaOps

    from .kernel_rows_attn import stored_caches

    kc, vc = stored_caches(i)
    return CudaOps().paged_attention(_up(i["q"]), _up(kc), _up(vc), i["meta"], i["scale"])


for name, seqs, hkv, group, d, decode_only in [("decode-b2-hkv3-g3-d64", [(7, 1), (40, 1)], 3, 3, 64, True),
                                                ("prefill-b2-hkv2-g4-d64", [(50, 50), (30, 6)], 2, 4, 64, False)]:
    ROWS.append(KernelRow("ops.paged_attention", name, _paged_case(seqs, hkv, group, d, decode_only), _paged_ref,
                          _paged_cuda, 3e-3))
