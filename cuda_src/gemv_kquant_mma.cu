// Q4_K / Q5_K / Q6_K linear for decode batches 2-64 on int8 tensor cores (sm_80+), with the
// activations quantized per 256-value super-block (llama.cpp's Q8_K: one scale per 256, plus the
// integer sum of every 32) instead of per 32. With one activation scale across a weight super-block,
// the weight's integer sub-block scales (and Q4_K / Q5_K's mins) apply to the int32 mma results in
// integer arithmetic, and floats appear once per super-block rather than once per sub-block and
// output -- the float epilogue had been half of the instructions of the per-32 kernel, which
// issue-bound it at ~1.7 TB/s.
//
// quantize_q8k_x<SILU>: x [n, K] float32 (row stride ldx; SILU: silu(x) * up) -> xq int8
// [K / 32, n, 32] (chunk-major: the 32 values of every column at each k / 32 side by side, so that
// the 8 columns of a B fragment are one contiguous 256-byte read instead of 8 rows' 32 bytes each),
// xd float [n, K / 256] (amax / 127 of each 256), xb int16 [n, K / 32] (sum of each 32's int8).
// One warp per 256 values, 8 per lane; grid covers n * K / 256 warps.
//
// gemv_kquant_mma<QT, NT, TG, WARPS, U, MINB, RW, ACC, FULL, MT>: block of WARPS warps on RW groups
// of MT 16-row tiles, the WARPS / RW warps of a group each a strided share of the rows'
// super-blocks, U at a time (in
// NT / TG passes, see below), partial tiles summed through shared memory. The groups of a block
// read the same activations at about the same time, so RW > 1 serves them RW times from L1 for
// one read from L2 (at 8 tiles the activations of a super-block are 7x its weights' bytes).
// Lane (g, t) = (lane / 4, lane % 4) holds rows g and g + 8 and batch columns 2t, 2t + 1 of each
// of NT 8-column tiles. Q4_K (Q5_K: plus the fifth bits):
// lane t reads bytes 8t..8t+7 of each 32-byte quant group (values 8t..8t+7 of its two
// sub-blocks), the B fragment the same 8 activations -- a permutation of k that A and B share.
// Per sub-block: c = q . x (m16n8k32), isum += scale * c; per super-block: the mins' term
// msum = sum(min * xsum) as one fp16 m16n8k16 (mins_frag, sums_frag), then
// y += xd * (d * isum - dmin * msum). Q6_K: m16n8k16 per group of 16 (lane t: values 4t..4t+3),
// isum += scale * c, y += xd * d * isum.
// Grid: ceil(rows / (16 MT RW)). Needs K % 256 == 0 and batch <= 8 * NT.
#include "kquant_mma.cuh"
#include "pdl.cuh"
#include "q8_act.cuh"

#define KM_WARPS 8

template <bool SILU>
__global__ void quantize_q8k_x(const float* __restrict__ x, long long ldx, const float* __restrict__ up,
                               long long ldu, int k, long long nsb, signed char* __restrict__ xq,
                               float* __restrict__ xd, short* __restrict__ xb) {
    pdl_wait();
    const long long sb = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;   // one warp per super-block
    const int lane = threadIdx.x & 31;
    if (sb >= nsb) return;                                                             // whole warps exit
    const long long row = sb * 256 / k, col = sb * 256 - row * k + 8 * lane;
    float v[8];
    *reinterpret_cast<float4*>(v) = *reinterpret_cast<const float4*>(x + row * ldx + col);
    *reinterpret_cast<float4*>(v + 4) = *reinterpret_cast<const float4*>(x + row * ldx + col + 4);
    if constexpr (SILU) {
        float u[8];
        *reinterpret_cast<float4*>(u) = *reinterpret_cast<const float4*>(up + row * ldu + col);
        *reinterpret_cast<float4*>(u + 4) = *reinterpret_cast<const float4*>(up + row * ldu + col + 4);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = pq::silu_mul1(v[i], u[i]);
    }
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float id = q8_inv_scale(amax);
    int q[8], s = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        q[i] = __float2int_rn(v[i] * id);
        s += q[i];
    }
    s += __shfl_xor_sync(0xffffffffu, s, 1);        // the 4 lanes of one 32
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    const long long n = nsb * 256 / k;
    *reinterpret_cast<uint2*>(xq + ((col >> 5) * n + row) * 32 + (col & 31)) =
        make_uint2(q8_pack4(q[0], q[1], q[2], q[3]), q8_pack4(q[4], q[5], q[6], q[7]));
    if ((lane & 3) == 0) xb[sb * 8 + (lane >> 2)] = (short)s;
    if (lane == 0) xd[sb] = amax / 127.0f;
}


// TG: tiles per pass over the rows' super-blocks (NT / TG passes, the weights re-read from L1 / L2
// after the first), so that a warp holds TG tiles' integer sums instead of NT's and more warps fit
// an SM; WARPS: warps per block; U: super-blocks a warp works on at once, so that the loads of
// the next are in flight during the current one's mma (kquant_mma_cuda.kquant_mma_groups picks them);
// MINB: blocks per SM the registers must allow (0: 16 / WARPS warps' worth up to 2 tiles, 8 past).
#define KM_LAUNCH_BOUNDS __launch_bounds__(WARPS * 32, MINB ? MINB : (TG <= 2 ? 16 : 8) / WARPS)

// Shared memory of a block for the partial tiles (NT of each of MT row tiles) of the warps past
// the first of each row group.
template <int NT, int WARPS, int RW, int MT>
using KmRed = float[WARPS > RW ? WARPS - RW : 1][NT * MT * 4][32];

// Rows 16 MT RW blk .. 16 MT RW (blk + 1) - 1 of one weight (the body of both kernels below); red:
// the block's shared memory for the warps' partial tiles. Warp w takes row group w % RW, of MT
// 16-row tiles.
template <int QT, int NT, int TG, int WARPS, int U, int RW, int ACC, int FULL, int MT>
__device__ __forceinline__ void kquant_mma_rows(const u8* __restrict__ W, long long bpr, int rows, int K, int blk,
                                                const signed char* __restrict__ xq, const float* __restrict__ xd,
                                                const short* __restrict__ xb, int nb, const float* __restrict__ bias,
                                                float* __restrict__ y, KmRed<NT, WARPS, RW, MT>& red) {
    static_assert(NT % TG == 0, "TG divides NT");
    static_assert(WARPS % RW == 0, "RW divides WARPS");
    constexpr int KW = WARPS / RW;   // KW: warps sharing a row group's super-blocks
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int rg = warp % RW, kw = warp / RW, row0 = (blk * RW + rg) * 16 * MT, first = blk * RW * 16 * MT;
    const u8* ra[MT];
    const u8* rb[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        ra[m] = W + (i64)min(row0 + 16 * m + g, rows - 1) * bpr;
        rb[m] = W + (i64)min(row0 + 16 * m + g + 8, rows - 1) * bpr;
    }
    prefetch_l2(W + (i64)first * bpr, bpr * (min(rows, first + 16 * MT * RW) - first));
    pdl_wait();
    float acc[NT][MT][4];
    mma_tiles_zero(acc);
    const int nblk = K / 256;
#pragma unroll
    for (int p = 0; p < NT / TG; ++p) {
        const int c0 = 8 * TG * p;                       // first batch column of this pass
        const ActsK<TG, FULL ? 256 * NT : 0> x{xq + 32 * c0, xd + (i64)c0 * (K / 256), xb + (i64)c0 * (K / 32), K,
                                               max(nb - c0, 1), g, t, 32 * (i64)nb};
        float(&accp)[TG][MT][4] = *reinterpret_cast<float(*)[TG][MT][4]>(&acc[TG * p]);
        if (c0 < nb && (RW == 1 || row0 < rows)) {   // a group wholly past the last row idles
            int b = kw;
            for (; b + (U - 1) * KW < nblk; b += U * KW)
#pragma unroll
                for (int u = 0; u < U; ++u)
                    kquant_superblock<QT, TG, ACC>(ra, rb, b + u * KW, x, accp);
            for (; U > 1 && b < nblk; b += KW)
                kquant_superblock<QT, TG, ACC>(ra, rb, b, x, accp);
        }
    }
    mma_tiles_store<NT, MT, RW, KW>(acc, red, warp, rg, kw, lane, row0, rows, nb, nullptr, bias, y);
}

template <int QT, int NT, int TG = NT, int WARPS = KM_WARPS, int U = 1, int MINB = 0, int RW = 1, int ACC = 0,
          int FULL = 0, int MT = 1>
__global__ void KM_LAUNCH_BOUNDS
gemv_kquant_mma(const u8* __restrict__ W, long long bpr, int rows, int K, const signed char* __restrict__ xq,
                const float* __restrict__ xd, const short* __restrict__ xb, int nb, const float* __restrict__ bias,
                float* __restrict__ y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    __shared__ KmRed<NT, WARPS, RW, MT> red;
    kquant_mma_rows<QT, NT, TG, WARPS, U, RW, ACC, FULL, MT>(W, bpr, rows, K, blockIdx.x, xq, xd, xb, nb, bias, y, red);
#else
    pdl_wait();
#endif
}

// Two or three weights of one input in one launch (the q, k, v projections, of mixed types in
// Q4_K_M / Q5_K_M), as gemv_kquant3 joins them at batch 1: blocks [0, end_a) take weight a,
// [end_a, end_b) b, the rest c (blocks of 16 MT RW rows); each writes its own output. The short
// k and v weights, latency-bound alone, ride in the grid of q.
#define PQ_KM_SEG(s) const u8 *__restrict__ W##s, long long bpr_##s, int rows_##s, const float *__restrict__ bias_##s, \
                     float *__restrict__ y_##s
template <int QA, int QB, int QC, int NT, int TG, int WARPS, int U, int MINB = 0, int RW = 1, int ACC = 0,
          int FULL = 0, int MT = 1>
__global__ void KM_LAUNCH_BOUNDS
gemv_kquant_mma3(int K, const signed char* __restrict__ xq, const float* __restrict__ xd, const short* __restrict__ xb,
                 int nb, int end_a, int end_b, PQ_KM_SEG(a), PQ_KM_SEG(b), PQ_KM_SEG(c)) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    __shared__ KmRed<NT, WARPS, RW, MT> red;
    const int blk = blockIdx.x;
    if (blk < end_a)
        kquant_mma_rows<QA, NT, TG, WARPS, U, RW, ACC, FULL, MT>(Wa, bpr_a, rows_a, K, blk, xq, xd, xb, nb, bias_a, y_a,
                                                             red);
    else if (blk < end_b)
        kquant_mma_rows<QB, NT, TG, WARPS, U, RW, ACC, FULL, MT>(Wb, bpr_b, rows_b, K, blk - end_a, xq, xd, xb, nb,
                                                             bias_b, y_b, red);
    else
        kquant_mma_rows<QC, NT, TG, WARPS, U, RW, ACC, FULL, MT>(Wc, bpr_c, rows_c, K, blk - end_b, xq, xd, xb, nb,
                                                             bias_c, y_c, red);
#else
    pdl_wait();
#endif
}
#undef PQ_KM_SEG
#undef KM_LAUNCH_BOUNDS

#ifndef __CUDACC_RTC__
template __global__ void quantize_q8k_x<false>(const float*, long long, const float*, long long, int, long long,
                                               signed char*, float*, short*);
template __global__ void quantize_q8k_x<true>(const float*, long long, const float*, long long, int, long long,
                                              signed char*, float*, short*);
// nvcc-only instances (the module NVRTC builds names its own): gemv_kquant_mma<QT, NT, TG, WARPS, U[,
// MINB, RW, ACC, FULL, MT]>; every tile count, type and launch feature once rather than every
// combination (all of them made this the slowest file of CI's compile check)
#define PQ_INSTK(...)                                                                                          \
    template __global__ void gemv_kquant_mma<__VA_ARGS__>(const u8*, long long, int, int, const signed char*,  \
                                                          const float*, const short*, int, const float*, float*);
PQ_INSTK(pq::Q4_K, 1, 1, 4, 2) PQ_INSTK(pq::Q4_K, 8, 8, 4, 2) PQ_INSTK(pq::Q5_K, 2, 2, 4, 2)
PQ_INSTK(pq::Q6_K, 4, 4, 4, 2) PQ_INSTK(pq::Q6_KR, 8, 8, 4, 2)
PQ_INSTK(pq::Q4_K, 8, 4, 4, 1) PQ_INSTK(pq::Q4_K, 8, 2, 8, 1)
PQ_INSTK(pq::Q4_K, 8, 8, 4, 2, 0, 4) PQ_INSTK(pq::Q6_KR, 4, 4, 8, 1, 0, 4) PQ_INSTK(pq::Q5_K, 2, 2, 4, 2, 0, 2)
PQ_INSTK(pq::Q4_K, 1, 1, 4, 2, 0, 1, 1, 0) PQ_INSTK(pq::Q5_K, 4, 4, 4, 1, 0, 1, 1, 0)
PQ_INSTK(pq::Q4_K, 8, 8, 4, 1, 0, 4, 1, 1) PQ_INSTK(pq::Q6_KR, 8, 8, 4, 1, 0, 4, 0, 1)
PQ_INSTK(pq::Q4_K, 1, 1, 4, 1, 0, 1, 0, 0, 2) PQ_INSTK(pq::Q5_K, 1, 1, 4, 1, 0, 1, 0, 0, 2)
PQ_INSTK(pq::Q6_KR, 1, 1, 4, 1, 0, 1, 0, 0, 2) PQ_INSTK(pq::Q6_K, 2, 2, 4, 1, 0, 1, 0, 0, 2)
#define PQ_INST3(...)                                                                                       \
    template __global__ void gemv_kquant_mma3<pq::Q4_K, pq::Q4_K, pq::Q6_KR, __VA_ARGS__>(                    \
        int, const signed char*, const float*, const short*, int, int, int, const u8*, long long, int,        \
        const float*, float*, const u8*, long long, int, const float*, float*, const u8*, long long, int,    \
        const float*, float*);
PQ_INST3(1, 1, 4, 2) PQ_INST3(8, 8, 4, 2)
PQ_INST3(8, 8, 4, 1, 3, 1, 1) PQ_INST3(4, 4, 8, 1, 0, 4)
#undef PQ_INST3
#undef PQ_INSTK
#endif
