// The tensor-core kernels whose warps hold MT 16-row tiles x NT 8-column tiles of a block's rows
// (gemv_kquant_mma.cu, gemm_kquant_tile.cu, gemm_codes_tile.cu): their accumulators' start, the tile
// kernels' main loop over shared-memory stages, their end, and split K's sum of parts.
#pragma once

#include "common.cuh"

template <int NT, int MT> __device__ __forceinline__ void mma_tiles_zero(float (&acc)[NT][MT][4]) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int m = 0; m < MT; ++m) acc[nt][m][0] = acc[nt][m][1] = acc[nt][m][2] = acc[nt][m][3] = 0.0f;
}

// A block's loop over `steps` steps of K in ST shared-memory stages, the first ST - 1 already issued
// by the caller (a cp.async group each): each step waits for its stage, has load(stage, step) copy the
// step ST - 1 ahead into the stage the last one freed, and runs use(stage, step); at the end every
// copy has landed.
template <int ST, class Load, class Use>
__device__ __forceinline__ void cp_async_stages(int steps, Load&& load, Use&& use) {
    for (int it = 0; it < steps; ++it) {
        cp_async_wait<ST - 2>();
        __syncthreads();                 // stage it landed for all; stage it - 1 free for the next copy
        const int nx = it + ST - 1;
        if (nx < steps) load(nx % ST, nx);
        cp_async_commit();
        use(it % ST, it);
    }
    cp_async_wait<0>();
}

// The KW warps of a row group (warp = kw * RW + rg) add their tiles through red ([(KW - 1) * RW]
// [NT * MT * 4][32], written by the warps past the first), and the first writes y [nb, rows] from
// row r0, its MT 16-row tiles in c-fragment order, times row_scale[row] (where not null), plus
// bias[row] (where not null); the others return.
template <int NT, int MT, int RW, int KW>
__device__ __forceinline__ void mma_tiles_store(const float (&acc)[NT][MT][4], float (*red)[NT * MT * 4][32], int warp,
                                                int rg, int kw, int lane, int r0, int rows, int nb,
                                                const float* __restrict__ row_scale, const float* __restrict__ bias,
                                                float* __restrict__ y) {
    const int g = lane >> 2, t = lane & 3;
    if (KW > 1 && kw > 0) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int i = 0; i < 4; ++i) red[warp - RW][4 * (MT * nt + m) + i][lane] = acc[nt][m][i];
    }
    if constexpr (KW > 1) __syncthreads();
    if (kw > 0) return;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int m = 0; m < MT; ++m) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                float v = acc[nt][m][i];
#pragma unroll
                for (int w = 1; w < KW; ++w) v += red[(w - 1) * RW + rg][4 * (MT * nt + m) + i][lane];
                const int row = r0 + 16 * m + g + 8 * (i >> 1), col = 8 * nt + 2 * t + (i & 1);   // c fragment
                if (row < rows && col < nb) {
                    if (row_scale) v *= row_scale[row];
                    y[(i64)col * rows + row] = bias ? v + bias[row] : v;
                }
            }
        }
    }
}

// Split K's end, after a block of grid (x, s) wrote its part of rows [row0, row0 + nrows) to ws[s]
// ([SK][nb][rows]): the last of column x's SK blocks to get here adds the parts in order of s into y
// [nb, rows] (the same sums whichever finishes last) and leaves counters[x] at 0 for the next launch.
__device__ __forceinline__ void split_k_fixup(const float* ws, int* counters, int sk, int rows, int nb, int row0,
                                              int nrows, float* __restrict__ y) {
    __shared__ int last;
    __threadfence();   // this block's part, visible to the block that adds them
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(counters + blockIdx.x, 1) == sk - 1;
        if (last) counters[blockIdx.x] = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int n = min(nrows, rows - row0);
    for (int i = threadIdx.x; i < n * nb; i += blockDim.x) {
        const int col = i / n, r = row0 + i - col * n;
        float v = 0.0f;
        for (int s = 0; s < sk; ++s) v += __ldcg(ws + ((i64)s * nb + col) * rows + r);
        y[(i64)col * rows + r] = v;
    }
}
