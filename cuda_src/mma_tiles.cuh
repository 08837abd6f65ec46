// The end of the tensor-core kernels whose warps hold MT 16-row tiles x NT 8-column tiles of a
// block's rows (gemv_kquant_mma.cu, gemm_kquant_tile.cu, gemm_codes_tile.cu).
#pragma once

#include "common.cuh"

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
