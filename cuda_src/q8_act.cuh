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

// Per 256 values (quantize_q8k_x's layout, the K-quant tensor-core linears' input): the 256 values
// of a super-block are 64 consecutive threads' float4s, two warps of the block (blockDim.x a
// multiple of 64, i % 64 == threadIdx.x % 64), whose maxima meet in wmax (a float per warp). The
// whole block calls it. i: the float4's index in row `row` of the [rows, 4 * n4] activations
// (n4 % 64 == 0); xq chunk-major [n4 / 8, rows, 32], xd [rows, n4 / 64], xb [rows, n4 / 8] (the
// integer sum of each 32).
__device__ __forceinline__ void q8k_store4(float4 o, int i, bool ok, float* wmax, signed char* __restrict__ xq,
                                           float* __restrict__ xd, short* __restrict__ xb, long long row,
                                           long long rows, long long n4) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float amax = fmaxf(fmaxf(fabsf(o.x), fabsf(o.y)), fmaxf(fabsf(o.z), fabsf(o.w)));
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
    __syncthreads();                                 // wmax may still be read by a previous call (or block_sum)
    if (lane == 0) wmax[warp] = amax;
    __syncthreads();
    amax = fmaxf(wmax[warp & ~1], wmax[warp | 1]);
    const float id = q8_inv_scale(amax);
    const int q0 = __float2int_rn(o.x * id), q1 = __float2int_rn(o.y * id);
    const int q2 = __float2int_rn(o.z * id), q3 = __float2int_rn(o.w * id);
    int s = q0 + q1 + q2 + q3;
#pragma unroll
    for (int m = 1; m < 8; m <<= 1) s += __shfl_xor_sync(0xffffffffu, s, m);   // the 8 lanes of one 32
    if (!ok) return;
    const long long g = row * n4 + i;              // in [rows, 4 * n4] / 4
    ((unsigned*)xq)[((long long)(i >> 3) * rows + row) * 8 + (i & 7)] = q8_pack4(q0, q1, q2, q3);
    if ((i & 7) == 0) xb[g >> 3] = (short)s;
    if ((i & 63) == 0) xd[g >> 6] = amax / 127.0f;
}
