// End of a GEMV block (1 to 4 warps, R rows x NB batch columns per block): sum the
// per-thread partials across the warps through shared memory, then inside warp 0 with
// shuffles; lane r*NB+n writes y[n, row0+r] (+ bias).
#pragma once

namespace pq {

constexpr int GEMV_THREADS = 128;

template <int NB, int R>
__device__ __forceinline__ void gemv_reduce_store(float (&acc)[R][NB], int row0, int rows,
                                                  const float* __restrict__ bias, float* __restrict__ y) {
    static_assert(R * NB <= 32, "one output per lane of warp 0");
    __shared__ float red[GEMV_THREADS / 32 - 1][R * NB][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    if (warp > 0) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int n = 0; n < NB; ++n) red[warp - 1][r * NB + n][lane] = acc[r][n];
    }
    __syncthreads();
    if (warp > 0) return;
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int n = 0; n < NB; ++n) {
            float v = acc[r][n];
#pragma unroll
            for (int w = 0; w < GEMV_THREADS / 32 - 1; ++w)
                if (w < nwarps - 1) v += red[w][r * NB + n][lane];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            const int row = row0 + r;
            if (lane == r * NB + n && row < rows) y[(long long)n * rows + row] = bias ? v + bias[row] : v;
        }
    }
}

}  // namespace pq
