// One row of at most 32 * E values normalised by one warp, the row in registers: out =
// rms_norm(x (+ res if ADD)) * w, and res_out = x + res unless res_out is null. Pointers at the
// row's value 0; res_out may alias res (each value is read and written by the same lane); whole
// warps call it. ADD is a template argument rather than a null test of res: with the test the
// loads went out one branch at a time (the add norm 4.4 us instead of 2.1 at 576 wide, H200).
// The warp-per-row norm kernels (norm.cu) and the GEMV that normalises its own input
// (gemv_gguf_f32.cu) share it, so both give the same bits.
#pragma once
#include "common.cuh"

template <int E, bool ADD>
__device__ __forceinline__ void warp_norm_row(const float* __restrict__ x, const float* res,
                                              const float* __restrict__ w, float* __restrict__ out, float* res_out,
                                              int dim, float eps) {
    const int lane = threadIdx.x & 31;
    float h[E], wv[E];
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int d = lane + 32 * e;
        h[e] = 0.0f;
        wv[e] = 0.0f;
        if (d < dim) {
            h[e] = ADD ? x[d] + res[d] : x[d];
            wv[e] = w[d];
        }
    }
    if (ADD && res_out) {
#pragma unroll
        for (int e = 0; e < E; ++e)
            if (lane + 32 * e < dim) res_out[lane + 32 * e] = h[e];
    }
#pragma unroll
    for (int e = 0; e < E; ++e) ss += h[e] * h[e];
    const float r = rsqrtf(warp_sum(ss) / dim + eps);
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int d = lane + 32 * e;
        if (d < dim) out[d] = h[e] * r * wv[e];
    }
}
