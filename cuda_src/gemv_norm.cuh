// The residual-add RMSNorm as the epilogue of a batch-1 GEMV (gemv_kquant_norm, gemv_gguf_norm: both
// are gemv_norm_block with their own loop over a row's units), for the linears whose output feeds a
// norm (the o and down projections of a Llama layer): a block owns 32 output rows, as 32 / R groups
// of SB threads that each own R consecutive rows (norm_group_rows) and stride over their units.
// norm_block_reduce leaves the warps' sums in shared memory, norm_row_sum adds those of one of the
// 32 rows in a fixed order, and warp 0 then takes a row a lane (norm_epilogue): h = y (+ bias) +
// res, stored to res (in place), and g = h * w_norm as int8 blocks of 32 (q8_act.cuh's rounding)
// into yq / yds, without the norm's rsqrt(mean(h^2) + eps); instead ypart[blockIdx.x] = the block's
// sum of h^2 + 32 * eps, from which the GEMVs reading yq take that scale (xnorm_scale). No block
// waits on another, and the norm costs no launch of its own.
#pragma once

#include "gguf_prims.cuh"
#include "pdl.cuh"
#include "q8_act.cuh"

namespace pq {

// The R rows of W that the calling thread's group owns (32 * blockIdx.x + group * R ..), their first
// lines prefetched into L2. (This unsigned row arithmetic keeps gemv_kquant_norm's PTX as it was
// measured; a signed row parameter cost it registers.)
template <int R, int SB>
PQ_DEV void norm_group_rows(const u8* __restrict__ W, long long bpr, const u8* (&wr)[R]) {
    const int t = threadIdx.x % SB;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        wr[r] = W + (long long)(blockIdx.x * 32 + threadIdx.x / SB * R + r) * bpr;
        if (t * 128 < bpr) prefetch_l2_line(wr[r] + t * 128);
    }
}

// The warps' sums of their R rows into red[warp][r]; the whole block calls it (it synchronises).
template <int R>
PQ_DEV void norm_block_reduce(const float (&acc)[R][1], float (*red)[R]) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        float v = acc[r][0];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5][r] = v;
    }
    __syncthreads();
}

// Local row lr's sum (its group: lr / R) after norm_block_reduce.
template <int R, int SB>
PQ_DEV float norm_row_sum(const float (*red)[R], int lr) {
    float y = 0.0f;
#pragma unroll
    for (int w = 0; w < SB / 32; ++w) y += red[lr / R * (SB / 32) + w][lr % R];
    return y;
}

// Warp 0, lane l: y = row 32 * blockIdx.x + l of the linear (bias added here), r_in / wn its
// residual and norm weight (loaded before the GEMV's loop).
PQ_DEV void norm_epilogue(float y, float r_in, float wn, float eps, const float* __restrict__ bias,
                          float* __restrict__ res, i8* __restrict__ yq, float4* __restrict__ yds,
                          float* __restrict__ ypart) {
    const int lane = threadIdx.x & 31, row = blockIdx.x * 32 + lane;
    if (bias) y += bias[row];
    const float h = y + r_in, g = h * wn;
    res[row] = h;
    float amax = fabsf(g), ss = h * h;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
    }
    const int q = __float2int_rn(g * q8_inv_scale(amax));
    yq[row] = (i8)q;
    int s16 = q;
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) s16 += __shfl_xor_sync(0xffffffffu, s16, o);   // lanes 0-15 / 16-31
    const int s16_hi = __shfl_sync(0xffffffffu, s16, 16);
    if (lane == 0) {
        const float d = amax / 127.0f;
        yds[blockIdx.x] = make_float4(d, d * (float)(s16 + s16_hi), d * (float)s16, d * (float)s16_hi);
        ypart[blockIdx.x] = ss + 32.0f * eps;
    }
}

// The whole block: group i of its 32 / R groups of SB threads owns rows 32 * blockIdx.x + i * R ..;
// accum(wr, t, acc) adds thread t's units (t, t + SB, ...) of rows wr into acc[R][1]. rows % 32 == 0.
template <int R, int SB, typename Accum>
PQ_DEV void gemv_norm_block(const u8* __restrict__ W, long long bpr, const float* __restrict__ bias,
                            float* __restrict__ res, const float* __restrict__ w_norm, float eps,
                            i8* __restrict__ yq, float4* __restrict__ yds, float* __restrict__ ypart, Accum accum) {
    __shared__ float red[32 / R * (SB / 32)][R];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row = blockIdx.x * 32 + lane;       // warp 0's row in the epilogue
    const u8* wr[R];
    norm_group_rows<R, SB>(W, bpr, wr);
    const float wn = warp == 0 ? w_norm[row] : 0.0f;
    pdl_wait();
    const float r_in = warp == 0 ? res[row] : 0.0f;   // loaded now, used after the loop
    float acc[R][1] = {};
    accum(wr, threadIdx.x % SB, acc);
    norm_block_reduce<R>(acc, red);
    if (warp > 0) return;
    norm_epilogue(norm_row_sum<R, SB>(red, lane), r_in, wn, eps, bias, res, yq, yds, ypart);
}

}  // namespace pq
