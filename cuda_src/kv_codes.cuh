// The KV cache's element types (C): __half values, or codes with float32 parameters per (token, KV
// head) row (quant/kv_quant.py): int8 (signed char; value = code * scale), OCP FP8 E4M3 (u8; value =
// e4m3(code) * scale), and 4-bit codes two a byte (nib2, k8v4's values; per group of 32 a scale and
// a minimum: value = code * scale + min). The attention kernels read 8 codes as 8 fp16 values
// without their parameters (exact: int8 and int4 through the 1024 + u trick, E4M3 by moving its bits
// into fp16's, which gives e4m3 / 256) and apply the parameters themselves (Param: the scale, or
// (scale, min) of the 8 values' group; the scale times HALF_SCALE). The stores quantize a row as the
// NumPy reference does (float32 parameters, codes rounded to nearest even).
#pragma once

#include "common.cuh"

struct nib2 {                                           // two 4-bit codes: value 2i low, 2i + 1 high
    u8 b;
};

template <typename C> struct KvCode;

template <> struct KvCode<__half> {
    static constexpr bool QUANT = false;
    static constexpr int PER_ELEM = 1;                  // values per element
    static constexpr float HALF_SCALE = 1.0f;
    typedef uint4 Vec8;                                 // 8 values
    typedef float Param;                                // (unused)
};

// Two words of fp16 pairs 0x64XX (1024 + XX) minus the fp16 `offset` (its bits) from each half
__device__ __forceinline__ void half_pairs_minus(u32 a, u32 b, unsigned short offset, u32& lo, u32& hi) {
    const __half2 off = __halves2half2(__ushort_as_half(offset), __ushort_as_half(offset));
    const __half2 ha = __hsub2(*reinterpret_cast<const __half2*>(&a), off);
    const __half2 hb = __hsub2(*reinterpret_cast<const __half2*>(&b), off);
    lo = *reinterpret_cast<const u32*>(&ha);
    hi = *reinterpret_cast<const u32*>(&hb);
}

template <> struct KvCode<signed char> {
    static constexpr bool QUANT = true;
    static constexpr int PER_ELEM = 1;
    static constexpr float CODE_MAX = 127.0f;
    static constexpr float HALF_SCALE = 1.0f;
    typedef uint2 Vec8;
    typedef float Param;
    // codes b0..b3 of w -> fp16 pairs (b0, b1), (b2, b3): 0x64XX is 1024 + XX in fp16, and XX is
    // the code + 128, so subtracting 1152 (0x6480) leaves the code
    static __device__ __forceinline__ void half4(u32 w, u32& lo, u32& hi) {
        w ^= 0x80808080u;
        half_pairs_minus(__byte_perm(w, 0x64646464u, 0x4140), __byte_perm(w, 0x64646464u, 0x4342), 0x6480, lo, hi);
    }
    static __device__ __forceinline__ signed char encode(float y) { return (signed char)__float2int_rn(y); }
};

template <> struct KvCode<u8> {
    static constexpr bool QUANT = true;
    static constexpr int PER_ELEM = 1;
    static constexpr float CODE_MAX = 448.0f;
    static constexpr float HALF_SCALE = 256.0f;         // fp16 with E4M3's bits is its value / 2^8
    typedef uint2 Vec8;
    typedef float Param;
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

template <> struct KvCode<nib2> {
    static constexpr bool QUANT = true;
    static constexpr int PER_ELEM = 2;
    static constexpr int GROUP = 32;                    // values per (scale, min)
    static constexpr float HALF_SCALE = 1.0f;
    typedef u32 Vec8;
    typedef float2 Param;                               // (scale, min) of the values' group
    // the 8 nibbles of w -> fp16 pairs (n0, n1), (n2, n3), ...: byte i in both halves of a word,
    // its low nibble in the low half and its high one in the high half, over 0x6400 (1024)
    static __device__ __forceinline__ uint4 half8(u32 w) {
        u32 h[4];
#pragma unroll
        for (int i = 0; i < 4; i += 2) {
            const u32 a = __byte_perm(w, 0u, 0x4040 + 0x0101 * i), b = __byte_perm(w, 0u, 0x4141 + 0x0101 * i);
            half_pairs_minus((a & 0x0000000Fu) | ((a >> 4) & 0x000F0000u) | 0x64006400u,
                             (b & 0x0000000Fu) | ((b >> 4) & 0x000F0000u) | 0x64006400u, 0x6400, h[i], h[i + 1]);
        }
        return make_uint4(h[0], h[1], h[2], h[3]);
    }
};

// Vec8 at value col of row `row` (head_dim values a row)
template <typename C>
__device__ __forceinline__ const typename KvCode<C>::Vec8* kv_vec8(const C* cache, i64 row, int head_dim, int col) {
    return reinterpret_cast<const typename KvCode<C>::Vec8*>(cache + (row * head_dim + col) / KvCode<C>::PER_ELEM);
}

// The parameters of value col's row (and group): the scale, or (scale, min) of int4's group
template <typename C>
__device__ __forceinline__ typename KvCode<C>::Param kv_param(const float* scales, i64 row, int head_dim, int col) {
    if constexpr (KvCode<C>::PER_ELEM == 2) {
        const int groups = head_dim / KvCode<C>::GROUP;
        return *reinterpret_cast<const float2*>(scales + 2 * (row * groups + col / KvCode<C>::GROUP));
    } else {
        return scales[row];
    }
}

// 8 elements as 8 fp16 values, without their parameters
template <typename C>
__device__ __forceinline__ uint4 kv_half8(const typename KvCode<C>::Vec8& r) {
    if constexpr (KvCode<C>::PER_ELEM == 2) {
        return KvCode<C>::half8(r);
    } else if constexpr (KvCode<C>::QUANT) {
        uint4 h;
        KvCode<C>::half4(r.x, h.x, h.y);
        KvCode<C>::half4(r.y, h.z, h.w);
        return h;
    } else {
        return r;
    }
}

// 8 codes as fp16 values with their parameters applied in float32 (rounded once)
template <typename C>
__device__ __forceinline__ uint4 kv_scaled8(const typename KvCode<C>::Vec8& r, typename KvCode<C>::Param p) {
    const uint4 h = kv_half8<C>(r);
    u32 w[4] = {h.x, h.y, h.z, h.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
        __half2 o;
        if constexpr (KvCode<C>::PER_ELEM == 2) {
            o = __floats2half2_rn(fmaf(f.x, p.x, p.y), fmaf(f.y, p.x, p.y));
        } else {
            const float s = p * KvCode<C>::HALF_SCALE;
            o = __floats2half2_rn(f.x * s, f.y * s);
        }
        w[i] = *reinterpret_cast<const u32*>(&o);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// 8 elements of row `row` (slot * num_kv_heads + head) from value col as fp16 values with the row's
// parameters applied (the fp16 cache: its values); scales: the rows' parameters (unused for fp16)
template <typename C>
__device__ __forceinline__ uint4 kv_load8_scaled(const C* __restrict__ cache, const float* __restrict__ scales,
                                                 i64 row, int head_dim, int col) {
    const typename KvCode<C>::Vec8 r = *kv_vec8<C>(cache, row, head_dim, col);
    if constexpr (KvCode<C>::QUANT) {
        return kv_scaled8<C>(r, kv_param<C>(scales, row, head_dim, col));
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

// A warp stores one row of head_dim <= 32 E values quantized: lane l holds values l + 32e in v[e]
// (0 past head_dim), row `row` of codes [rows, head_dim / PER_ELEM] and params [rows, P]. 8-bit:
// one scale. int4: group e is v[e] of the whole warp (a scale and minimum each, by warp reductions);
// lane l's code goes into nibble l % 2 of byte (l + 32e) / 2, written by the even lane.
template <typename C, int E>
__device__ __forceinline__ void quant_row(const float (&v)[E], C* __restrict__ codes, float* __restrict__ params,
                                          i64 row, int head_dim, int lane) {
    if constexpr (KvCode<C>::PER_ELEM == 2) {
        const int groups = head_dim / KvCode<C>::GROUP;
        u8* out = reinterpret_cast<u8*>(codes) + row * head_dim / 2;
#pragma unroll
        for (int e = 0; e < E; ++e) {
            if (e >= groups) break;                     // warp-uniform
            const float lo = -warp_max(-v[e]), span = warp_max(v[e]) - lo;
            const float inv = span > 0.0f ? 15.0f / span : 0.0f;
            const u32 n = (u32)min(max(__float2int_rn((v[e] - lo) * inv), 0), 15);
            const u32 hi = __shfl_down_sync(PC_FULL_MASK, n, 1);
            if (!(lane & 1)) out[(lane + 32 * e) / 2] = (u8)(n | (hi << 4));
            if (lane == 0) {
                params[2 * (row * groups + e)] = span / 15.0f;
                params[2 * (row * groups + e) + 1] = lo;
            }
        }
    } else {
        float amax = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) amax = fmaxf(amax, fabsf(v[e]));
        const float inv = kv_warp_row_scale<C>(amax, params + row, lane == 0);
#pragma unroll
        for (int e = 0; e < E; ++e) {
            const int c = lane + 32 * e;
            if (c < head_dim) codes[row * head_dim + c] = KvCode<C>::encode(v[e] * inv);
        }
    }
}

// A warp quantizes one row of head_dim <= 256 values x (lane l reading l, l + 32, ...) into row `row`
// of codes and params (quant_row).
template <typename C>
__device__ __forceinline__ void store_row_quant(const float* __restrict__ x, C* __restrict__ codes,
                                                float* __restrict__ scales, i64 row, int head_dim, int lane) {
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const int c = lane + 32 * e;
        v[e] = c < head_dim ? x[c] : 0.0f;
    }
    quant_row<C>(v, codes, scales, row, head_dim, lane);
}
