// Q4_K / Q5_K / Q6_K (as Q6_KR) linear for decode batches of 33-64 on int8 tensor cores (sm_80+), the
// activations of a super-block staged once a block in shared memory. gemv_kquant_mma.cu's warps
// each read a super-block's activations for all 64 batch columns (16 KB, 7x their rows' weight
// bytes) through L1 / L2; here a block of RG row groups x KW warps copies, per step, KW
// super-blocks of its rows' weights and of the activations (quantize_q8k_x's per-256 form:
// chunk-major int8, scales, 32-sums) into one of ST shared-memory stages with cp.async, ST - 1
// steps ahead, and every warp runs kquant_mma.cuh's super-block step on shared-memory pointers.
//
// gemm_kquant_tile<QT, MT, RG, KW, ST>: warp w takes row group w % RG (16 MT rows) and super-block
// KW s + w / RG of step s; the KW warps of a row group sum their tiles through shared memory at the
// end. Block: 32 RG KW threads, KtLayout::SMEM bytes of dynamic shared memory; grid: ceil(rows /
// (16 MT RG)). Needs K % 256 == 0, batch nb <= 64 and 16-byte aligned super-blocks (Q6_K as Q6_KR).
#include "kquant_mma.cuh"
#include "pdl.cuh"

// Shared-memory layout of one super-block of a stage: the block's rows' weights (each row padded to
// SROW bytes so that the lanes' fragment loads of 8 rows hit distinct banks), then the 64 columns'
// int8 activations [8 chunks][64][32], their scales [64] and 32-sums [64][8]; for Q6_KR then the
// rows' d's, as 4-byte pairs of super-blocks 2j, 2j + 1 [ROWS] (cp.async copies 4 bytes at least).
template <int QT, int MT, int RG, int KW, int ST>
struct KtLayout {
    static constexpr int TS = pq::QTraits<QT>::TS;
    static constexpr int SROW = QT == pq::Q4_K ? 160 : QT == pq::Q6_KR ? 208 : 224;
    static constexpr int ROWS = 16 * MT * RG;
    static constexpr int W_BYTES = ROWS * SROW, X_BYTES = 8 * 64 * 32, XD_BYTES = 64 * 4, XB_BYTES = 64 * 16;
    static constexpr int D_OFF = W_BYTES + X_BYTES + XD_BYTES + XB_BYTES;
    static constexpr int SB_BYTES = D_OFF + (QT == pq::Q6_KR ? 4 * ROWS : 0);
    static constexpr int STAGE = KW * SB_BYTES, SMEM = ST * STAGE, THREADS = 32 * RG * KW;
    static_assert(TS % 16 == 0 && SROW >= TS, "16-byte aligned super-blocks");
};

// Weights of step `step` (super-blocks KW step ..) into a stage: issued before pdl_wait (constant).
template <int QT, int MT, int RG, int KW, int ST>
__device__ __forceinline__ void kt_load_w(u8* stage, const u8* __restrict__ W, long long bpr, int rows, int row0,
                                          int step, int nblk) {
    using L = KtLayout<QT, MT, RG, KW, ST>;
    constexpr int P = L::TS / 16;
#pragma unroll
    for (int s = 0; s < KW; ++s) {
        const int sblk = KW * step + s;
        if (sblk >= nblk) break;
        u8* base = stage + s * L::SB_BYTES;
        for (int i = threadIdx.x; i < L::ROWS * P; i += L::THREADS) {
            const int r = i / P, p = i - r * P;
            cp_async16(base + r * L::SROW + 16 * p, pq::block_at<QT>(W + (i64)min(row0 + r, rows - 1) * bpr, sblk) + 16 * p);
        }
        if constexpr (QT == pq::Q6_KR) {
            for (int r = threadIdx.x; r < L::ROWS; r += L::THREADS)
                cp_async_zfill<4>(base + L::D_OFF + 4 * r,
                                  pq::block_d<QT>(W + (i64)min(row0 + r, rows - 1) * bpr, nblk, sblk & ~1), true);
        }
    }
}

// Activations of step `step` into a stage; columns past nb are zeros.
template <int QT, int MT, int RG, int KW, int ST>
__device__ __forceinline__ void kt_load_x(u8* stage, const signed char* __restrict__ xq, const float* __restrict__ xd,
                                          const short* __restrict__ xb, int nb, int K, int step, int nblk) {
    using L = KtLayout<QT, MT, RG, KW, ST>;
#pragma unroll
    for (int s = 0; s < KW; ++s) {
        const int sblk = KW * step + s;
        if (sblk >= nblk) break;
        u8* xs = stage + s * L::SB_BYTES + L::W_BYTES;
        for (int i = threadIdx.x; i < 8 * 64 * 2; i += L::THREADS) {       // chunk j, column, half
            const int j = i >> 7, col = (i >> 1) & 63, h = i & 1;
            const bool ok = col < nb;
            cp_async_zfill<16>(xs + j * 2048 + col * 32 + 16 * h, xq + ((i64)(8 * sblk + j) * nb + (ok ? col : 0)) * 32 + 16 * h, ok);
        }
        for (int i = threadIdx.x; i < 128; i += L::THREADS) {
            const int col = i & 63;
            const bool ok = col < nb;
            const i64 c = ok ? col : 0;
            if (i < 64)
                cp_async_zfill<4>(xs + L::X_BYTES + 4 * col, xd + c * (K / 256) + sblk, ok);
            else
                cp_async_zfill<16>(xs + L::X_BYTES + L::XD_BYTES + 16 * col, xb + c * (K / 32) + 8 * sblk, ok);
        }
    }
}

// Rows 16 MT RG blk .. of one weight: the body of both kernels below.
template <int QT, int MT, int RG, int KW, int ST>
__device__ __forceinline__ void kt_rows(u8* kt_smem, const u8* __restrict__ W, long long bpr, int rows, int K, int blk,
                                        const signed char* __restrict__ xq, const float* __restrict__ xd,
                                        const short* __restrict__ xb, int nb, const float* __restrict__ bias,
                                        float* __restrict__ y) {
    using L = KtLayout<QT, MT, RG, KW, ST>;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int rg = warp % RG, kw = warp / RG, row0 = blk * L::ROWS;
    const int nblk = K / 256, steps = (nblk + KW - 1) / KW;
#pragma unroll
    for (int s = 0; s < ST - 1; ++s)
        if (s < steps) kt_load_w<QT, MT, RG, KW, ST>(kt_smem + s * L::STAGE, W, bpr, rows, row0, s, nblk);
    pdl_wait();
#pragma unroll
    for (int s = 0; s < ST - 1; ++s) {
        if (s < steps) kt_load_x<QT, MT, RG, KW, ST>(kt_smem + s * L::STAGE, xq, xd, xb, nb, K, s, nblk);
        cp_async_commit();
    }
    float acc[8][MT][4];
    mma_tiles_zero(acc);
    const auto load = [&](int stage, int step) {
        u8* st = kt_smem + stage * L::STAGE;
        kt_load_w<QT, MT, RG, KW, ST>(st, W, bpr, rows, row0, step, nblk);
        kt_load_x<QT, MT, RG, KW, ST>(st, xq, xd, xb, nb, K, step, nblk);
    };
    cp_async_stages<ST>(steps, load, [&](int stage, int it) {
        if (KW * it + kw < nblk) {
            const u8* base = kt_smem + stage * L::STAGE + kw * L::SB_BYTES;
            const u8* xs = base + L::W_BYTES;
            const u8* ra[MT];
            const u8* rb[MT];
            const u8* da[MT];
            const u8* db[MT];
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                const int r = 16 * (MT * rg + m) + g;
                ra[m] = base + r * L::SROW;
                rb[m] = ra[m] + 8 * L::SROW;
                da[m] = base + L::D_OFF + 4 * r + 2 * ((KW * it + kw) & 1);   // Q6_KR only
                db[m] = da[m] + 4 * 8;
            }
            const ActsK<8, 2048> x{reinterpret_cast<const signed char*>(xs), reinterpret_cast<const float*>(xs + L::X_BYTES),
                                   reinterpret_cast<const short*>(xs + L::X_BYTES + L::XD_BYTES), 256, 64, g, t, 2048};
            kquant_superblock_k<QT, 8, 2048, MT>(ra, rb, da, db, 0, x, acc);
        }
    });
    if constexpr (KW > 1) __syncthreads();   // the stages become red: every warp is done reading them
    mma_tiles_store<8, MT, RG, KW>(acc, reinterpret_cast<float(*)[8 * MT * 4][32]>(kt_smem), warp, rg, kw, lane,
                                   row0 + 16 * MT * rg, rows, nb, nullptr, bias, y);
}

template <int QT, int MT, int RG, int KW, int ST>
__global__ void __launch_bounds__(32 * RG * KW)
gemm_kquant_tile(const u8* __restrict__ W, long long bpr, int rows, int K, const signed char* __restrict__ xq,
                 const float* __restrict__ xd, const short* __restrict__ xb, int nb, const float* __restrict__ bias,
                 float* __restrict__ y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    extern __shared__ __align__(16) u8 kt_smem[];
    kt_rows<QT, MT, RG, KW, ST>(kt_smem, W, bpr, rows, K, blockIdx.x, xq, xd, xb, nb, bias, y);
#else
    pdl_wait();
#endif
}

// Two or three weights of one input in one launch (q, k, v of mixed types), as gemv_kquant_mma3
// joins them: blocks [0, end_a) take weight a, [end_a, end_b) b, the rest c; dynamic shared memory
// for the largest of the three layouts.
#define PQ_KT_SEG(s) const u8 *__restrict__ W##s, long long bpr_##s, int rows_##s, const float *__restrict__ bias_##s, \
                     float *__restrict__ y_##s
template <int QA, int QB, int QC, int MT, int RG, int KW, int ST>
__global__ void __launch_bounds__(32 * RG * KW)
gemm_kquant_tile3(int K, const signed char* __restrict__ xq, const float* __restrict__ xd, const short* __restrict__ xb,
                  int nb, int end_a, int end_b, PQ_KT_SEG(a), PQ_KT_SEG(b), PQ_KT_SEG(c)) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    extern __shared__ __align__(16) u8 kt_smem[];
    const int blk = blockIdx.x;
    if (blk < end_a)
        kt_rows<QA, MT, RG, KW, ST>(kt_smem, Wa, bpr_a, rows_a, K, blk, xq, xd, xb, nb, bias_a, y_a);
    else if (blk < end_b)
        kt_rows<QB, MT, RG, KW, ST>(kt_smem, Wb, bpr_b, rows_b, K, blk - end_a, xq, xd, xb, nb, bias_b, y_b);
    else
        kt_rows<QC, MT, RG, KW, ST>(kt_smem, Wc, bpr_c, rows_c, K, blk - end_b, xq, xd, xb, nb, bias_c, y_c);
#else
    pdl_wait();
#endif
}
#undef PQ_KT_SEG

#ifndef __CUDACC_RTC__
// nvcc-only instances (the module NVRTC builds names its own)
template __global__ void gemm_kquant_tile<pq::Q4_K, 2, 4, 1, 2>(const u8*, long long, int, int, const signed char*,
                                                                const float*, const short*, int, const float*, float*);
template __global__ void gemm_kquant_tile<pq::Q5_K, 2, 2, 1, 2>(const u8*, long long, int, int, const signed char*,
                                                                const float*, const short*, int, const float*, float*);
template __global__ void gemm_kquant_tile<pq::Q6_KR, 1, 2, 2, 2>(const u8*, long long, int, int, const signed char*,
                                                                 const float*, const short*, int, const float*, float*);
template __global__ void gemm_kquant_tile3<pq::Q4_K, pq::Q4_K, pq::Q6_KR, 1, 4, 1, 3>(
    int, const signed char*, const float*, const short*, int, int, int, const u8*, long long, int, const float*, float*,
    const u8*, long long, int, const float*, float*, const u8*, long long, int, const float*, float*);
#endif
