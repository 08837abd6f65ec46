"""The NVFP4 code layout on the GPU (weight_cuda.nvfp4_relaid_codes) and the bit moves that
gemv_nvfp4.cu decodes it with (minifloat.cuh's e2m1x8_to_h2x4), emulated here in NumPy: every code in
every nibble position gives its E2M1 value in k order. The GPU rows (tests/kernel_rows_nvfp4.py) run
the kernels themselves."""
import numpy as np
import pytest

from pocketcupy.backend.weight_cuda import nvfp4_relaid_codes
from pocketcupy.quant.minifloat_weights import E2M1_VALUES, e2m1_values

TABLE_LO, TABLE_HI = 0x3E3C3800, 0x46444240      # minifloat.cuh: fp16 high bytes of 0, .5, 1, 1.5 | 2, 3, 4, 6


def prmt(a: np.ndarray, b: np.ndarray, sel: np.ndarray) -> np.ndarray:
    """PTX prmt.b32 (default mode): byte i of the result is byte (sel >> 4i) & 7 of {b, a}, or that
    byte's sign bit replicated where (sel >> 4i) & 8."""
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = np.zeros_like(sel)
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        byte = np.choose(nib & 7, src)
        byte = np.where(nib & 8, np.where(byte & 0x80, 0xFF, 0), byte)
        out |= byte << (8 * i)
    return out


def decode_word(w: np.ndarray) -> np.ndarray:
    """e2m1x8_to_h2x4 without the scale: uint32 words -> [n, 8] float32 values (fp16 pairs j = codes 2j, 2j + 1)."""
    w = w.astype(np.int64)
    lo, hi = np.full_like(w, TABLE_LO), np.full_like(w, TABLE_HI)
    m = w & 0x77777777
    even, odd = prmt(lo, hi, m), prmt(lo, hi, m >> 16)
    halves = []
    for j in range(4):
        sel = np.full_like(w, (8 + j) | (j << 4) | ((8 + j) << 8) | ((4 + j) << 12))
        v = prmt(even, odd, sel) | ((w << (12 - 4 * j)) & 0x80008000)
        halves += [v & 0xFFFF, v >> 16]
    bits = np.stack(halves, axis=-1).astype(np.uint16)
    return bits.view(np.float16).astype(np.float32)


def test_table_holds_the_e2m1_magnitudes():
    got = [np.uint16(((TABLE_LO, TABLE_HI)[m >> 2] >> (8 * (m & 3)) & 0xFF) << 8).view(np.float16) for m in range(8)]
    assert [float(v) for v in got] == E2M1_VALUES[:8].tolist()


def test_every_code_in_every_position_decodes_in_k_order():
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, (4096, 16), dtype=np.uint8)
    codes[:256, :] = np.arange(256)[:, None] >> 4    # each code in every position, besides random ones
    codes[256:512, :] = np.arange(256)[:, None] & 15
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)              # checkpoint packing: 2i low, 2i + 1 high
    relaid = nvfp4_relaid_codes(packed)
    assert relaid.shape == packed.shape and relaid.dtype == np.uint8
    words = relaid.view("<u4")                                     # [rows, 2]: codes 0..7 and 8..15
    got = np.concatenate([decode_word(words[:, 0]), decode_word(words[:, 1])], axis=1)
    want = e2m1_values(packed)
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want))      # -0 (code 8) included


def test_relaid_rows_keep_their_words():
    """The layout permutes nibbles within each 4-byte word only: a row's words stay in place."""
    rng = np.random.default_rng(1)
    packed = rng.integers(0, 256, (3, 64), dtype=np.uint8)
    relaid = nvfp4_relaid_codes(packed)
    for r in range(3):
        for wd in range(16):
            np.testing.assert_array_equal(np.sort(e2m1_values(relaid[r:r + 1, 4 * wd:4 * wd + 4])),
                                          np.sort(e2m1_values(packed[r:r + 1, 4 * wd:4 * wd + 4])))


@pytest.mark.gpu
def test_relay_on_the_device_matches_numpy():
    """prepare_weight re-lays the codes on the GPU (relay_nvfp4_codes); the NumPy function is its reference."""
    import cupy as cp

    from pocketcupy.backend.weight_cuda import relay_nvfp4_codes

    packed = np.random.default_rng(2).integers(0, 256, (37, 96), dtype=np.uint8)
    np.testing.assert_array_equal(cp.asnumpy(relay_nvfp4_codes(cp.asarray(packed))), nvfp4_relaid_codes(packed))
