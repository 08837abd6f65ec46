// The KV cache's element types (C): __half values, or 8-bit codes with a float32 scale per
// (token, KV head) row (quant/kv_quant.py): int8 (signed char; value = code * scale) and OCP FP8
// E4M3 (u8; value = e4m3(code) * scale). The attention kernels read 8 codes as 8 fp16 values
// without their scale (exact for both: int8 through the 1024 + u trick, E4M3 by moving its bits
// into fp16's, which gives e4m3 / 256), and apply the row's scale times HALF_SCALE themselves; the
// stores quantize a row as the NumPy reference does (float32 scale amax / CODE_MAX, codes of
// x * (CODE_MAX / amax) rounded to nearest even).
#pragma once

#include "common.cuh"

template <typename C> struct KvCode;

template <> struct KvCode<__half> {
    static constexpr bool QUANT = false;
    static constexpr float HALF_SCALE = 1.0f;           // (the kernels' code paths for fp16 fold it away)
    typedef uint4 Vec8;                                 // 8 elements
};

template <> struct KvCode<signed char> {
    static constexpr bool QUANT = true;
    static constexpr float CODE_MAX = 127.0f;
    static constexpr float HALF_SCALE = 1.0f;
    typedef uint2 Vec8;
    // codes b0..b3 of w -> fp16 pairs (b0, b1), (b2, b3): 0x64XX is 1024 + XX in fp16, and XX is
    // the code + 128, so subtracting 1152 (0x6480) leaves the code
    static __device__ __forceinline__ void half4(u32 w, u32& lo, u32& hi) {
        w ^= 0x80808080u;
        const u32 a = __byte_perm(w, 0x64646464u, 0x4140), b = __byte_perm(w, 0x64646464u, 0x4342);
        const __half2 off = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));
        const __half2 ha = __hsub2(*reinterpret_cast<const __half2*>(&a), off);
        const __half2 hb = __hsub2(*reinterpret_cast<const __half2*>(&b), off);
        lo = *reinterpret_cast<const u32*>(&ha);
        hi = *reinterpret_cast<const u32*>(&hb);
    }
    static __device__ __forceinline__ signed char encode(float y) { return (signed char)__float2int_rn(y); }
};

template <> struct KvCode<u8> {
    static constexpr bool QUANT = true;
    static constexpr float CODE_MAX = 448.0f;
    static constexpr float HALF_SCALE = 256.0f;         // fp16 with E4M3's bits is its value / 2^8
    typedef uint2 Vec8;
    // E4M3 (bias 7) -> fp16 (bias 15): sign to bit 15, exponent and mantissa to bits 7..13 (the
    // subnormals map onto fp16 subnormals)
    static __device__ __forceinline__ void half4(u32 w, u32& lo, u32& hi) {
        const u32 a = __byte_perm(w, 0u, 0x1404), b = __byte_perm(w, 0u, 0x3424);   // b0 << 8 | b1 << 24, ...
        lo = ((a >> 1) & 0x3F803F80u) | (a & 0x80008000u);
        hi = ((b >> 1) & 0x3F803F80u) | (b & 0x80008000u);
    }
    // |y| <= 448 rounded to the nearest E4M3 value, ties to even: below 2^-6 a multiple of 2^-9
    // (subnormals; 8 * 2^-9 is the first normal, code 8), else the float's top three mantissa bits
    // rounded by an integer add (a carry moves into the exponent), exponent rebiased 127 -> 7
    static __device__ __forceinline__ u8 encode(float y) {
        const float a = fabsf(y);
        u32 code;
        if (a < 0.015625f) {
            code = (u32)__float2int_rn(a * 512.0f);
        } else {
            const u32 ab = __float_as_uint(a);
            code = ((ab + 0x7FFFFu + ((ab >> 20) & 1u)) >> 20) - (120u << 3);
        }
        code = min(code, 0x7Eu);
        return (u8)(code != 0 && y < 0.0f ? code | 0x80u : code);   // no negative zero (as NumPy)
    }
};

// 8 cache elements at p (16-byte aligned for fp16, 8-byte for codes) as 8 fp16 values, unscaled
template <typename C>
__device__ __forceinline__ uint4 kv_half8(const typename KvCode<C>::Vec8& r) {
    if constexpr (KvCode<C>::QUANT) {
        uint4 h;
        KvCode<C>::half4(r.x, h.x, h.y);
        KvCode<C>::half4(r.y, h.z, h.w);
        return h;
    } else {
        return r;
    }
}

// 8 codes as fp16 values times s (a row's scale times HALF_SCALE), rounded once from float32
template <typename C>
__device__ __forceinline__ uint4 kv_scaled8(const typename KvCode<C>::Vec8& r, float s) {
    const uint4 h = kv_half8<C>(r);
    u32 w[4] = {h.x, h.y, h.z, h.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
        const __half2 o = __floats2half2_rn(f.x * s, f.y * s);
        w[i] = *reinterpret_cast<const u32*>(&o);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// 8 elements of row `row` (slot * num_kv_heads + head) from column col as fp16 values with the
// row's scale applied (the fp16 cache: its values); scales: float32 per row (unused for fp16)
template <typename C>
__device__ __forceinline__ uint4 kv_load8_scaled(const C* __restrict__ cache, const float* __restrict__ scales,
                                                 i64 row, int head_dim, int col) {
    const typename KvCode<C>::Vec8 r =
        *reinterpret_cast<const typename KvCode<C>::Vec8*>(cache + row * head_dim + col);
    if constexpr (KvCode<C>::QUANT) {
        return kv_scaled8<C>(r, scales[row] * KvCode<C>::HALF_SCALE);
    } else {
        return r;
    }
}

// A row's scale (amax / CODE_MAX) and the factor its values are multiplied by before rounding
// (CODE_MAX / amax; 0 for a row of zeros, whose codes are then 0)
template <typename C>
__device__ __forceinline__ float kv_row_scale(float amax, float& inv) {
    inv = amax > 0.0f ? KvCode<C>::CODE_MAX / amax : 0.0f;
    return amax / KvCode<C>::CODE_MAX;
}

// The same for a row spread over a warp (each lane's largest |value| given): every lane gets inv;
// the lane with write set stores the scale
template <typename C>
__device__ __forceinline__ float kv_warp_row_scale(float lane_amax, float* scale, bool write) {
    float inv;
    const float s = kv_row_scale<C>(warp_max(lane_amax), inv);
    if (write) *scale = s;
    return inv;
}

// A warp quantizes one row of head_dim <= 256 values x (lane l reading l, l + 32, ...) into row `row`
// of codes [rows, head_dim] and scales [rows].
template <typename C>
__device__ __forceinline__ void store_row_quant(const float* __restrict__ x, C* __restrict__ codes,
                                                float* __restrict__ scales, i64 row, int head_dim, int lane) {
    float v[8], amax = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const int c = lane + 32 * e;
        v[e] = c < head_dim ? x[c] : 0.0f;
        amax = fmaxf(amax, fabsf(v[e]));
    }
    const float inv = kv_warp_row_scale<C>(amax, scales + row, lane == 0);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const int c = lane + 32 * e;
        if (c < head_dim) codes[row * head_dim + c] = KvCode<C>::encode(v[e] * inv);
    }
}
