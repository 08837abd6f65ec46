// Minifloat codes to fp16 by moving bits (the weight codes of gemv_fp8.cu and gemv_nvfp4.cu).
#pragma once

#include "mma_prims.cuh"

// 4 E4M3 codes -> fp16 pairs (value * 2^-8): lo = codes 0, 1; hi = codes 2, 3. The sign goes to bit
// 15 and the 7 exponent + mantissa bits to bits 7..13, subnormals included (NaN codes 0x7f / 0xff,
// which checkpoints do not hold, become 1.875 * 2^-8).
__device__ __forceinline__ void e4m3x4_to_h2x2(u32 w, u32& lo, u32& hi) {
    const u32 a = __byte_perm(w, 0u, 0x5140), b = __byte_perm(w, 0u, 0x5342);
    lo = ((a & 0x00800080u) << 8) | ((a & 0x007f007fu) << 7);
    hi = ((b & 0x00800080u) << 8) | ((b & 0x007f007fu) << 7);
}

// One E4M3 code -> an fp16 pair holding its value * 2^-8 twice
__device__ __forceinline__ u32 e4m3_to_h2_bcast(u32 code) {
    const u32 h = ((code & 0x80u) << 8) | ((code & 0x7fu) << 7);
    return h | (h << 16);
}

__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
    u32 d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

// 8 E2M1 codes c0..c7 (k order) of a word laid out by nvfp4_relaid_codes (weight_cuda.py) as the nibbles
// c0 c2 c4 c6 c1 c3 c5 c7 (nibble 0 first) -> h[j] = fp16 pair (c_2j, c_2j+1), each value times s2 (an
// fp16 pair, the group's scale). The magnitudes pick the high bytes of their fp16 (0, .5, 1, 1.5, 2, 3, 4,
// 6; the low bytes are 0) from a table with prmt, a second prmt puts bytes j of the two lookups into the
// high bytes of pair j (selectors 8 + j give 0x00: the sign of a table byte, which is 0), and each sign bit
// moves to bit 15 / 31 by one shift a pair. An E2M1 value times an E4M3 scale (times 2^-8) is exact in fp16.
__device__ __forceinline__ void e2m1x8_to_h2x4(u32 w, u32 s2, u32 (&h)[4]) {
    constexpr u32 TABLE_LO = 0x3E3C3800u, TABLE_HI = 0x46444240u;
    const u32 m = w & 0x77777777u;
    const u32 even = prmt(TABLE_LO, TABLE_HI, m), odd = prmt(TABLE_LO, TABLE_HI, m >> 16);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const u32 v = prmt(even, odd, (8u + j) | (j << 4) | ((8u + j) << 8) | ((4u + j) << 12));
        const u32 sign = (w << (12 - 4 * j)) & 0x80008000u;
        const u32 vs = v | sign;
        const __half2 p = __hmul2(*reinterpret_cast<const __half2*>(&vs), *reinterpret_cast<const __half2*>(&s2));
        h[j] = *reinterpret_cast<const u32*>(&p);
    }
}

// 16 codes (8 bytes) and their scale code -> 8 fp16 pairs, codes (0, 1), (2, 3), ..., (14, 15)
__device__ __forceinline__ void e2m1x16_to_h2x8(const uint2& w, u32 scale_code, u32 (&h)[8]) {
    const u32 s2 = e4m3_to_h2_bcast(scale_code);
    e2m1x8_to_h2x4(w.x, s2, *reinterpret_cast<u32(*)[4]>(&h[0]));
    e2m1x8_to_h2x4(w.y, s2, *reinterpret_cast<u32(*)[4]>(&h[4]));
}

// Whether a kernel instance with HW = true converts E4M3 codes with the hardware's cvt (sm_89+): its fp16 are the
// codes' values themselves, not times 2^-8
template <bool HW>
__device__ __forceinline__ constexpr bool hw_cvt() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    return HW;
#else
    return false;
#endif
}

template <bool HW>
__device__ __forceinline__ void e4m3x16_to_h2x8(const uint4& w, u32 (&h)[8]) {
    const u32 v[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
        if constexpr (HW) {
            asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}"
                : "=r"(h[2 * i]), "=r"(h[2 * i + 1]) : "r"(v[i]));
            continue;
        }
#endif
        e4m3x4_to_h2x2(v[i], h[2 * i], h[2 * i + 1]);
    }
}

// An fp16 pair of two floats rounded to nearest, saturated at +-65504 (one cvt on sm_80+)
__device__ __forceinline__ u32 pack_f2h2_sat(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    u32 d;
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
#else
    return pack_f2h2(fminf(fmaxf(lo, -65504.0f), 65504.0f), fminf(fmaxf(hi, -65504.0f), 65504.0f));
#endif
}
