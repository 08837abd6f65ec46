// GEMV over raw GGUF blocks for batch 1-8 (llama.cpp's MMVQ scheme): the fp32 activations
// are first quantized to int8 blocks of 32 (quantize_q8_x), then each weight unit of 32
// values (gguf_units.cuh) is dotted with them by __dp4a.
//
// gemv_gguf<QT, NB, R>: block of 32-128 threads (fewer for short rows) owns R rows; its
// threads stride over the (block, unit) pairs of those rows, each unit's weights read once
// and used for all NB activation rows.  Grid: ceil(rows / R).  XN: the sums take xnorm_scale(xpart) (gemv_reduce.cuh).
// gemv_gguf_norm: the batch-1 GEMV with a norm epilogue (gemv_norm.cuh) for these types.
#include "gguf_units.cuh"
#include "gemv_norm.cuh"
#include "gemv_reduce.cuh"
#include "q8_act.cuh"
#include "pdl.cuh"

using namespace pq;

// x [rows, k] float32 (k a multiple of 32, row stride ldx) -> xq [rows * k] int8, xds [rows * k / 32]
// float4 per block of 32 (q8_act.cuh).
// SILU: the values are silu(x) * up (row stride ldu), the down projection's input of a gated MLP.
// HALF: write the rounded values d * q as fp16 to xh [rows * k] instead (the GEMM path's input).
// One thread per 4 values, 8 lanes per block of 32; grid covers rows * k / 4 threads.
template <bool SILU, bool HALF>
__global__ void quantize_q8_x(const float* __restrict__ x, long long ldx, const float* __restrict__ up,
                              long long ldu, int k, long long n4, i8* __restrict__ xq, float4* __restrict__ xds,
                              u16* __restrict__ xh) {
    pdl_wait();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const bool ok = i < n4;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (ok) {
        const long long row = i * 4 / k, col = i * 4 - row * k;
        v = *(const float4*)(x + row * ldx + col);
        if constexpr (SILU) {
            const float4 u = *(const float4*)(up + row * ldu + col);
            v = make_float4(silu_mul1(v.x, u.x), silu_mul1(v.y, u.y), silu_mul1(v.z, u.z), silu_mul1(v.w, u.w));
        }
    }
    const Q8x4 r = q8_round4(v);
    if constexpr (HALF) {
        if (ok) {
            const unsigned lo = f2h(r.d * (float)r.q[0]) | ((unsigned)f2h(r.d * (float)r.q[1]) << 16);
            const unsigned hi = f2h(r.d * (float)r.q[2]) | ((unsigned)f2h(r.d * (float)r.q[3]) << 16);
            ((uint2*)xh)[i] = make_uint2(lo, hi);
        }
    } else {
        q8_store4(r, i, ok, xq, xds);
    }
}

// Accumulates units t = t0, t0 + stride, ... (< nunits) of rows wr[0..R) against NB activation
// rows into acc.
template <int QT, int NB, int R>
__device__ __forceinline__ void gemv_units(const u8* const (&wr)[R], int K, int t0, int stride, const u32* tab,
                                           const i8* __restrict__ xq, const float4* __restrict__ xds,
                                           float (&acc)[R][NB]) {
    constexpr int QK = QTraits<QT>::QK, NSUB = QK / 32;
    const int nunits = (K / QK) * NSUB;
    const long long ldx = K, ldd = K / 32;
    for (int t = t0; t < nunits; t += stride) {
        // tc == t: the clamp left from a multi-unit form keeps this the machine code tested and
        // measured on the H200 (without it ptxas allocates registers differently)
        const int tc = min(t, nunits - 1), blk = t / NSUB;
        Unit u[R];
#pragma unroll
        for (int r = 0; r < R; ++r) decode_at<QT>(wr[r], K / QK, tc / NSUB, tc % NSUB, tab, u[r]);
        int p0, p1;
        unit_pos<QT>(t % NSUB, p0, p1);
        const i8* xb = xq + (long long)blk * QK;
        const float4* db = xds + (long long)blk * (QK / 32);
#pragma unroll
        for (int n = 0; n < NB; ++n) {
            const int4 x0 = *(const int4*)(xb + n * ldx + p0);
            const int4 x1 = *(const int4*)(xb + n * ldx + p1);
            const float4 d0 = db[n * ldd + (p0 >> 5)];
            const float4 d1 = db[n * ldd + (p1 >> 5)];
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r][n] += unit_dot<QT>(u[r], x0, x1, d0, d1, p0, p1);
        }
    }
}

template <int QT, int NB, int R, bool XN = false>
__global__ void __launch_bounds__(GEMV_THREADS)
gemv_gguf(const u8* __restrict__ W, long long bpr, int rows, int K, const i8* __restrict__ xq,
          const float4* __restrict__ xds, const float* __restrict__ xpart, const float* __restrict__ bias,
          float* __restrict__ y) {
    __shared__ u32 tab_s[QTraits<QT>::TAB > 0 ? QTraits<QT>::TAB : 1];
    const u32* tab = stage_table<QT>(tab_s);
    const int row0 = blockIdx.x * R;
    const u8* wr[R];
    block_row_ptrs<R>(W, bpr, row0, rows, wr);
    pdl_wait();
    const float* xp = XN && threadIdx.x < 32 ? xpart : nullptr;
    float xv[XN_EARLY];
    xnorm_load(xp, K, xv);

    float acc[R][NB] = {};
    gemv_units<QT, NB, R>(wr, K, threadIdx.x, blockDim.x, tab, xq, xds, acc);
    gemv_reduce_store<NB, R>(acc, row0, rows, bias, y, xnorm_scale(xp, K, xv));
}

// The batch-1 GEMV with the residual-add RMSNorm of its output as epilogue (gemv_norm.cuh's
// gemv_norm_block), a group's threads striding over their units as gemv_gguf's do. rows % 32 == 0;
// grid rows / 32.
template <int QT, int R, int SB>
__global__ void __launch_bounds__(32 / R * SB)
gemv_gguf_norm(const u8* __restrict__ W, long long bpr, int K, const i8* __restrict__ xq,
               const float4* __restrict__ xds, const float* __restrict__ bias,
               float* __restrict__ res, const float* __restrict__ w_norm, float eps, i8* __restrict__ yq,
               float4* __restrict__ yds, float* __restrict__ ypart) {
    __shared__ u32 tab_s[QTraits<QT>::TAB > 0 ? QTraits<QT>::TAB : 1];
    const u32* tab = stage_table<QT>(tab_s);
    gemv_norm_block<R, SB>(W, bpr, bias, res, w_norm, eps, yq, yds, ypart,
                           [&](const u8* const (&wr)[R], int t, float (&acc)[R][1]) {
                               gemv_units<QT, 1, R>(wr, K, t, SB, tab, xq, xds, acc);
                           });
}

#ifndef __CUDACC_RTC__
// nvcc (the CI compile test) sees every type's code; NVRTC instantiates via name_expressions
#define PQ_INST_Q(S, H) \
    template __global__ void quantize_q8_x<S, H>(const float*, long long, const float*, long long, int, long long, \
                                                 i8*, float4*, u16*);
PQ_INST_Q(false, false) PQ_INST_Q(true, false) PQ_INST_Q(false, true) PQ_INST_Q(true, true)
#undef PQ_INST_Q
#define PQ_INST(T)                                                                                    \
    template __global__ void gemv_gguf<T, 2, 4>(const u8*, long long, int, int, const i8*,            \
                                                const float4*, const float*, const float*, float*);
PQ_INST(Q4_0) PQ_INST(Q4_1) PQ_INST(Q5_0) PQ_INST(Q5_1) PQ_INST(Q8_0) PQ_INST(Q2_K) PQ_INST(Q3_K)
PQ_INST(Q4_K) PQ_INST(Q5_K) PQ_INST(Q6_K) PQ_INST(Q6_KR) PQ_INST(IQ2_XXS) PQ_INST(IQ2_XS) PQ_INST(IQ2_S)
PQ_INST(IQ3_XXS) PQ_INST(IQ3_S) PQ_INST(IQ4_NL) PQ_INST(IQ4_XS) PQ_INST(IQ1_S) PQ_INST(IQ1_M)
#undef PQ_INST
#define PQ_INST_N(R, SB)                                                                                   \
    template __global__ void gemv_gguf_norm<Q8_0, R, SB>(const u8*, long long, int, const i8*, const float4*, \
                                                         const float*, float*, const float*, float, i8*,      \
                                                         float4*, float*);
PQ_INST_N(1, 32) PQ_INST_N(4, 128)
#undef PQ_INST_N
#endif
