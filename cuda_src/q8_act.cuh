// fp32 activations -> int8 blocks of 32, the int8 GEMV's input (gemv_gguf.cu; act_q8.q8_roundtrip
// is the same arithmetic in NumPy): d = amax / 127, q = round-half-even(x * (127 / amax)).
// Eight consecutive lanes hold one block's 32 values, four each; every lane of the warp calls
// these (they shuffle), whether or not it stores.
#pragma once

// The int8 rounding every activation quantizer shares (per 32 here, per 256 in quantize_q8k_x and
// the NORM_Q8K norm): v -> round-half-even(v * q8_inv_scale(amax)), d = amax / 127.
__device__ __forceinline__ float q8_inv_scale(float amax) { return amax > 0.0f ? 127.0f / amax : 0.0f; }

// Four int8 values, little-endian in one word
__device__ __forceinline__ unsigned q8_pack4(int a, int b, int c, int d) {
    return (a & 0xff) | ((b & 0xff) << 8) | ((c & 0xff) << 16) | ((unsigned)(d & 0xff) << 24);
}

struct Q8x4 {
    float d;      // the block's scale
    int q[4];     // this lane's four rounded values
};

__device__ __forceinline__ Q8x4 q8_round4(float4 v) {
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float id = q8_inv_scale(amax);
    Q8x4 r;
    r.d = amax / 127.0f;
    r.q[0] = __float2int_rn(v.x * id);
    r.q[1] = __float2int_rn(v.y * id);
    r.q[2] = __float2int_rn(v.z * id);
    r.q[3] = __float2int_rn(v.w * id);
    return r;
}

// Stores lane's four int8 at xq[4i..4i+3] and, from the block's first lane, xds[i / 8] = (d, d*sum32,
// d*sum of the first 16, d*sum of the last 16).
__device__ __forceinline__ void q8_store4(const Q8x4& r, long long i, bool ok, signed char* __restrict__ xq,
                                          float4* __restrict__ xds) {
    int s16 = r.q[0] + r.q[1] + r.q[2] + r.q[3];
    s16 += __shfl_xor_sync(0xffffffffu, s16, 1);
    s16 += __shfl_xor_sync(0xffffffffu, s16, 2);
    const int s16_other = __shfl_xor_sync(0xffffffffu, s16, 4);
    if (!ok) return;
    ((unsigned*)xq)[i] = q8_pack4(r.q[0], r.q[1], r.q[2], r.q[3]);
    if ((threadIdx.x & 7) == 0)
        xds[i >> 3] = make_float4(r.d, r.d * (float)(s16 + s16_other), r.d * (float)s16, r.d * (float)s16_other);
}
