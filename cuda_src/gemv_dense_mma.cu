// Dense fp16 / bf16 GEMV for batch 1-8 on tensor cores (sm_80+): y[n, r] = x[n, :] . W[r, :]
// (+ bias[r]) with mma.sync m16n8k16, the weights as the 16-row A tile and the batch as the 8
// columns of B, so the dot products cost the same at batch 8 as at batch 2 and the kernel
// streams the weights at the bandwidth a batch-1 GEMV does.  x is rounded to the weight's
// 16-bit type, as the cuBLAS path past batch 8 does; accumulation is fp32.
//
// gemv_dense_mma<WT>: WT 0 fp16, 1 bf16.  Block of GM_WARPS warps on the same 16 rows, each warp
// a strided share of the 64-wide chunks of K, the warps' partial tiles summed through shared
// memory.  Inside a chunk lane (g, t) = (lane / 4, lane % 4) reads 16 consecutive weights of rows
// g and g + 8 and 16 activations of batch row g at k = 64c + 16t + [0, 16): mma step s takes
// the 4 values at 4s..4s+3 of them as the fragment's k pairs (2t, 2t + 1) and (2t + 8, 2t + 9),
// a permutation of k that A and B share.  Grid: ceil(rows / 16).  Needs K % 64 == 0.
#include "mma_prims.cuh"
#include "mma_tiles.cuh"

#define GM_WARPS 8
#define GM_UNROLL 2         // chunks whose loads are in flight together

template <int WT>
__device__ __forceinline__ u32 pack_x2(float lo, float hi) {
    if constexpr (WT == 0) return pack_f2h2(lo, hi);
    else return pack_f2bf2(lo, hi);
}

template <int WT>
__global__ void __launch_bounds__(GM_WARPS * 32, 2)   // min blocks: else ptxas waits on each chunk's loads
gemv_dense_mma(const u16* __restrict__ W, int rows, int K, const float* __restrict__ x, int nb,
               const float* __restrict__ bias, float* __restrict__ y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    __shared__ float red[GM_WARPS - 1][4][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 16;
    const uint4* wa = reinterpret_cast<const uint4*>(W + (i64)min(row0 + g, rows - 1) * K) + 2 * t;
    const uint4* wb = reinterpret_cast<const uint4*>(W + (i64)min(row0 + g + 8, rows - 1) * K) + 2 * t;
    prefetch_l2(W + (i64)row0 * K, 2ll * K * (min(rows, row0 + 16) - row0));
    pdl_wait();
    const bool has_x = g < nb;
    const float4* xr = reinterpret_cast<const float4*>(x + (i64)(has_x ? g : 0) * K) + 4 * t;
    const int nchunks = K >> 6;
    float c[1][1][4] = {{{0.0f, 0.0f, 0.0f, 0.0f}}};
    for (int c0 = warp; c0 < nchunks; c0 += GM_WARPS * GM_UNROLL) {
        uint4 a[GM_UNROLL][4];
        float4 xv[GM_UNROLL][4];
#pragma unroll
        for (int u = 0; u < GM_UNROLL; ++u) {   // unconditional loads (past the end: the last chunk, unused)
            const int ch = min(c0 + u * GM_WARPS, nchunks - 1);
            a[u][0] = __ldcs(wa + 8 * ch);
            a[u][1] = __ldcs(wa + 8 * ch + 1);
            a[u][2] = __ldcs(wb + 8 * ch);
            a[u][3] = __ldcs(wb + 8 * ch + 1);
#pragma unroll
            for (int i = 0; i < 4; ++i) xv[u][i] = xr[16 * ch + i];
        }
#pragma unroll
        for (int u = 0; u < GM_UNROLL; ++u) {
            const u32 ra[8] = {a[u][0].x, a[u][0].y, a[u][0].z, a[u][0].w, a[u][1].x, a[u][1].y, a[u][1].z, a[u][1].w};
            const u32 rb[8] = {a[u][2].x, a[u][2].y, a[u][2].z, a[u][2].w, a[u][3].x, a[u][3].y, a[u][3].z, a[u][3].w};
            const bool use_x = has_x && c0 + u * GM_WARPS < nchunks;
#pragma unroll
            for (int s = 0; s < 4; ++s) {
                const u32 af[4] = {ra[2 * s], rb[2 * s], ra[2 * s + 1], rb[2 * s + 1]};
                const float4 v = xv[u][s];
                const u32 b0 = use_x ? pack_x2<WT>(v.x, v.y) : 0u, b1 = use_x ? pack_x2<WT>(v.z, v.w) : 0u;
                if constexpr (WT == 0) mma_16816(c[0][0], af, b0, b1);
                else mma_16816_bf16(c[0][0], af, b0, b1);
            }
        }
    }
    mma_tiles_store<1, 1, 1, GM_WARPS>(c, red, warp, 0, warp, lane, row0, rows, nb, nullptr, bias, y);
#else
    pdl_wait();
#endif
}

#ifndef __CUDACC_RTC__
template __global__ void gemv_dense_mma<0>(const u16*, int, int, const float*, int, const float*, float*);
template __global__ void gemv_dense_mma<1>(const u16*, int, int, const float*, int, const float*, float*);
#endif
