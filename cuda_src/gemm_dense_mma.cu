// Dense fp16 / bf16 GEMM for batches 9-64 on tensor cores (sm_80+), the decode steps of many
// sequences: y[n, r] = x16[n, :] . W[r, :] (+ bias[r]), x16 the activations already rounded to the
// weight's 16-bit type, fp32 accumulation and output.  The weights stream once, straight from
// global memory into the A fragments of mma.sync m16n8k16 (as gemv_dense_mma.cu, whose k
// permutation this shares), and the batch is NT tiles of 8 columns of B read through L1.
//
// gemm_dense_mma<WT, NT, RW, KW>: WT 0 fp16, 1 bf16; block of RW x KW warps: warp (r, kw) owns the
// 16 rows row0 + 16r .. and the 64-wide chunks kw, kw + KW, ... of K; the RW warps of one kw read
// the same activations (L1 hits after the first), the KW partial tiles are summed through shared
// memory.  Lane (g, t) = (lane / 4, lane % 4) reads 16 consecutive weights of rows g and g + 8 and
// 16 activations of batch row 8j + g of tile j at k = 64c + 16t + [0, 16): mma step s takes values
// 4s..4s+3 of them.  Each warp keeps DM_PIPE chunks of weights in flight.
// Grid: ceil(rows / (16 RW)).  Needs K % 64 == 0, nb <= 8 NT, x16 rows 16-byte aligned.
#include "mma_prims.cuh"

#define DM_PIPE 2

// Chunk ch of the lane's weights: a[0..1] row g, a[2..3] row g + 8 (wa, wb: the rows, advanced by
// 2t); streamed (__ldcs), the weights are read once. gemv_dense_mma.cu has the same four loads
// inline, in the machine code measured on the H200.
__device__ __forceinline__ void load_w_chunk(const uint4* wa, const uint4* wb, int ch, uint4 (&a)[4]) {
    a[0] = __ldcs(wa + 8 * ch);
    a[1] = __ldcs(wa + 8 * ch + 1);
    a[2] = __ldcs(wb + 8 * ch);
    a[3] = __ldcs(wb + 8 * ch + 1);
}

template <int WT, int NT, int RW, int KW>
__global__ void __launch_bounds__(RW * KW * 32)
gemm_dense_mma(const u16* __restrict__ W, int rows, int K, const u16* __restrict__ x16, long long ldx, int nb,
               const float* __restrict__ bias, float* __restrict__ y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int RED = KW > 1 ? RW * 32 * NT * 4 : 1;     // floats of one k-warp's partial tiles
    __shared__ float red[KW > 1 ? KW - 1 : 1][RED];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wr = warp % RW, kw = warp / RW;
    const int row0 = blockIdx.x * 16 * RW + 16 * wr;
    const uint4* wa = reinterpret_cast<const uint4*>(W + (i64)min(row0 + g, rows - 1) * K) + 2 * t;
    const uint4* wb = reinterpret_cast<const uint4*>(W + (i64)min(row0 + g + 8, rows - 1) * K) + 2 * t;
    const int nchunks = K >> 6;
    uint4 a[DM_PIPE][4];
#pragma unroll
    for (int p = 0; p < DM_PIPE; ++p) {          // weights are no kernel's output: loaded before the wait
        load_w_chunk(wa, wb, min(kw + p * KW, nchunks - 1), a[p]);
    }
    pdl_wait();
    const uint4* xr[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) xr[j] = reinterpret_cast<const uint4*>(x16 + (i64)min(8 * j + g, nb - 1) * ldx) + 2 * t;
    float c[NT][4] = {};
    for (int c0 = kw; c0 < nchunks; c0 += KW * DM_PIPE) {
#pragma unroll
        for (int p = 0; p < DM_PIPE; ++p) {
            const int ch = c0 + p * KW;
            if (ch >= nchunks) break;
            const u32 ra[8] = {a[p][0].x, a[p][0].y, a[p][0].z, a[p][0].w, a[p][1].x, a[p][1].y, a[p][1].z, a[p][1].w};
            const u32 rb[8] = {a[p][2].x, a[p][2].y, a[p][2].z, a[p][2].w, a[p][3].x, a[p][3].y, a[p][3].z, a[p][3].w};
            const int next = ch + KW * DM_PIPE;
            if (next < nchunks) load_w_chunk(wa, wb, next, a[p]);
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const uint4 x0 = xr[j][8 * ch], x1 = xr[j][8 * ch + 1];
                const u32 xb[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    const u32 af[4] = {ra[2 * s], rb[2 * s], ra[2 * s + 1], rb[2 * s + 1]};
                    if constexpr (WT == 0) mma_16816(c[j], af, xb[2 * s], xb[2 * s + 1]);
                    else mma_16816_bf16(c[j], af, xb[2 * s], xb[2 * s + 1]);
                }
            }
        }
    }
    if constexpr (KW > 1) {
        if (kw > 0) {
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) red[kw - 1][(wr * 32 + lane) * NT * 4 + 4 * j + i] = c[j][i];
        }
        __syncthreads();
        if (kw > 0) return;
#pragma unroll
        for (int w = 0; w < KW - 1; ++w)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) c[j][i] += red[w][(wr * 32 + lane) * NT * 4 + 4 * j + i];
    }
    // c[j]: (row g, batch 8j + 2t), (row g, 8j + 2t + 1), (row g + 8, 8j + 2t), (row g + 8, 8j + 2t + 1)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int row = row0 + g + 8 * (i >> 1), n = 8 * j + 2 * t + (i & 1);
            if (row < rows && n < nb) y[(i64)n * rows + row] = bias ? c[j][i] + bias[row] : c[j][i];
        }
#else
    pdl_wait();
#endif
}

#ifndef __CUDACC_RTC__
template __global__ void gemm_dense_mma<0, 2, 8, 1>(const u16*, int, int, const u16*, long long, int, const float*, float*);
template __global__ void gemm_dense_mma<1, 8, 4, 2>(const u16*, int, int, const u16*, long long, int, const float*, float*);
template __global__ void gemm_dense_mma<1, 5, 2, 4>(const u16*, int, int, const u16*, long long, int, const float*, float*);
#endif
