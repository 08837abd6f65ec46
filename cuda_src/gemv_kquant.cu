// Q4_K / Q5_K / Q6_K GEMV with int8 activations (quantize_q8_x's blocks of 32) for small batches,
// cut along the blocks' own layout: a lane takes a 64-value group g (lane % 4, never changing, nor
// do the byte positions of its scales) of each 256-value super-block it visits.
//   Q4_K / Q5_K: 32 bytes of nibbles whose low halves are sub-block 2g and high halves 2g + 1, so
//   each 32-value activation block meets one weight scale and min; per 64 weights two 16-byte
//   loads, the 16-byte header (shared by the group's four lanes) and 16 DP4A.
//   Q6_K: 16 bytes each of ql[64n + 16i], ql[64n + 32 + 16i] and qh[32n + 16i] (n = g / 2,
//   i = g % 2) hold the 6-bit values 128n + 16i + 32q + e, q = 0..3, e = 0..15; they are dotted
//   unsigned (0..63, DP4A u8 x s8) and the offset 32 taken off with the activations' 16-value
//   sums. Q6_KR (as uploaded: 208-byte blocks, each 8's d's after them) reads those runs with
//   16-byte loads; raw 210-byte blocks are only 2-byte aligned (word loads and funnel shifts).
// The 32-value units of gemv_gguf.cu cost over 2x the instructions per weight (SASS: ~125 per 32
// Q4_K values against ~110 per 64 here), which bounded them at
// ~2.0-2.3 TB/s on the H200 (bench_decode_kernels.py).
//
// gemv_kquant<QT, NB, R, U>: a warp owns R rows (GEMV_THREADS / 32 warps a block), lane l takes
// groups l, l + 32, ..., U at a time with all their loads issued first; shuffles sum the lanes.
// Grid: ceil(rows / (R * GEMV_THREADS / 32)).  Needs K % 256 == 0.  Blocks of Q4_K / Q5_K are
// 16-byte aligned (144 and 176 bytes, rows start 16-byte aligned); Q6_K is read 4 bytes at a time.
// XN (gemv_kquant, gemv_kquant_split, gemv_kquant3): the activations are a norm epilogue's
// blocks and the sums take its scale (xnorm_scale); gemv_kquant_norm is that epilogue's GEMV
// (gemv_norm.cuh).
#include "gguf_units.cuh"
#include "gemv_norm.cuh"
#include "gemv_reduce.cuh"
#include "pdl.cuh"
#include "q8_act.cuh"

using namespace pq;

// scales (low byte: sub-block 2j, high byte: 2j + 1) and mins of group j from the header's 12
// scale bytes s0, s1, s2 (get_scale_min_k4 for two sub-blocks at once)
PQ_DEV void kq_scales(u32 s0, u32 s1, u32 s2, int j, u32& sc, u32& mn) {
    const u32 sh = 16 * (j & 1);
    const u32 a = (s0 >> sh) & 0xffffu, c = (s1 >> sh) & 0xffffu, e = (s2 >> sh) & 0xffffu;
    sc = j < 2 ? a & 0x3f3fu : (e & 0x0f0fu) | ((a >> 2) & 0x3030u);
    mn = j < 2 ? c & 0x3f3fu : ((e >> 4) & 0x0f0fu) | ((c >> 2) & 0x3030u);
}

template <int QT>
struct KqGroup {                // one row's loads for one 64-value group
    uint4 hd, q0, q1;           // header (d, dmin, scales); the group's 32 nibble bytes
    uint4 h0, h1;               // Q5_K: the 32 high-bit bytes (unused for Q4_K)
};

struct KqGroup6 {
    u32 l0[4], l1[4], h[4];     // ql[64n + 16i], ql[64n + 32 + 16i], qh[32n + 16i] (16 bytes each)
    u32 sc[2];                  // scale bytes 192 + 8n .. + 7 (the group's four: i, i + 2, i + 4, i + 6)
    u16 d;
};
template <> struct KqGroup<Q6_K> : KqGroup6 {};
template <> struct KqGroup<Q6_KR> : KqGroup6 {};

// Group j of super-block b of a row (nblk super-blocks) into g.
template <int QT>
PQ_DEV void kq_load(const u8* __restrict__ row, int b, int nblk, int j, KqGroup<QT>& g) {
    const u8* __restrict__ blk = block_at<QT>(row, b);
    if constexpr (QT == Q6_KR) {
        const int n = j >> 1, i = j & 1;
        ld16b<1>(blk + 64 * n + 16 * i, g.l0);
        ld16b<1>(blk + 64 * n + 32 + 16 * i, g.l1);
        ld16b<1>(blk + 128 + 32 * n + 16 * i, g.h);
        const uint2 sc = *(const uint2*)(blk + 192 + 8 * n);
        g.sc[0] = sc.x;
        g.sc[1] = sc.y;
    } else if constexpr (QT == Q6_K) {
        const int n = j >> 1, i = j & 1;
        ldu<4, true>(blk + 64 * n + 16 * i, g.l0);
        ldu<4, true>(blk + 64 * n + 32 + 16 * i, g.l1);
        ldu<4, true>(blk + 128 + 32 * n + 16 * i, g.h);
        ldu<2, true>(blk + 192 + 8 * n, g.sc);
    } else {
        constexpr int QS = QT == Q4_K ? 16 : 48;
        g.hd = *(const uint4*)blk;
        g.q0 = *(const uint4*)(blk + QS + 32 * j);
        g.q1 = *(const uint4*)(blk + QS + 32 * j + 16);
        if constexpr (QT == Q5_K) {
            g.h0 = *(const uint4*)(blk + 16);
            g.h1 = *(const uint4*)(blk + 32);
        }
    }
    if constexpr (IS_Q6K<QT>) g.d = ld16(block_d<QT>(row, nblk, b));
}

PQ_DEV int dp4a_us(u32 a, int b, int c) {   // unsigned bytes of a times signed bytes of b
#ifdef PQ_HOST_SHIM
    for (int k = 0; k < 4; ++k) c += (int)((a >> (8 * k)) & 0xffu) * (int)(i8)(b >> (8 * k));
    return c;
#else
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#endif
}

// the group's 64 weights as int8: lo[8] values 0..31 (sub-block 2j), hi[8] values 32..63
template <int QT>
PQ_DEV void kq_unpack(const KqGroup<QT>& g, int j, u32 (&lo)[8], u32 (&hi)[8]) {
    const u32 q[8] = {g.q0.x, g.q0.y, g.q0.z, g.q0.w, g.q1.x, g.q1.y, g.q1.z, g.q1.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        lo[i] = q[i] & 0x0f0f0f0fu;
        hi[i] = (q[i] >> 4) & 0x0f0f0f0fu;
    }
    if constexpr (QT == Q5_K) {
        const u32 h[8] = {g.h0.x, g.h0.y, g.h0.z, g.h0.w, g.h1.x, g.h1.y, g.h1.z, g.h1.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            lo[i] |= ((h[i] >> (2 * j)) & 0x01010101u) << 4;
            hi[i] |= ((h[i] >> (2 * j + 1)) & 0x01010101u) << 4;
        }
    }
}

PQ_DEV int dot32(const u32 (&w)[8], int4 x0, int4 x1) {
    return dot16(w + 4, x1) + dot16(w, x0);
}

// Q6_K: the group's four 16-value pieces q as unsigned 6-bit values w[q] (4 words each) and their
// scales times the block's d
PQ_DEV void q6k_unpack(const KqGroup6& g, int i, u32 (&w)[4][4], float (&sc)[4]) {
    const float d = h2f(g.d);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const u32* l = q & 1 ? g.l1 : g.l0;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const u32 lo = q < 2 ? l[k] & 0x0f0f0f0fu : (l[k] >> 4) & 0x0f0f0f0fu;
            const u32 hb = (q < 2 ? g.h[k] << (4 - 2 * q) : g.h[k] >> (2 * q - 4)) & 0x30303030u;
            w[q][k] = lo | hb;
        }
        const int si = i + 2 * q;                                   // byte of the 8 loaded
        sc[q] = d * (float)(int)(i8)((g.sc[si >> 2] >> (8 * (si & 3))) & 0xffu);
    }
}

// One group t of R rows (loads in g) against NB activation rows, Q4_K / Q5_K.
template <int QT, int NB, int R>
PQ_DEV void kq_q45k_step(const KqGroup<QT> (&g)[R], int t, int j, int K, const i8* __restrict__ xq,
                         const float4* __restrict__ xds, float (&acc)[R][NB]) {
    u32 lo[R][8], hi[R][8];
    float a0[R], a1[R], b0[R], b1[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        kq_unpack<QT>(g[r], j, lo[r], hi[r]);
        u32 sc, mn;
        kq_scales(g[r].hd.y, g[r].hd.z, g[r].hd.w, j, sc, mn);
        const float d = h2f((u16)(g[r].hd.x & 0xffffu)), dmin = h2f((u16)(g[r].hd.x >> 16));
        a0[r] = d * (float)(sc & 0xffu);
        a1[r] = d * (float)(sc >> 8);
        b0[r] = dmin * (float)(mn & 0xffu);
        b1[r] = dmin * (float)(mn >> 8);
    }
#pragma unroll
    for (int n = 0; n < NB; ++n) {
        const int4* xp = (const int4*)(xq + n * (long long)K + 64ll * t);
        const int4 x0 = xp[0], x1 = xp[1], x2 = xp[2], x3 = xp[3];
        const float4* dp = xds + n * (long long)(K / 32) + 2ll * t;
        const float2 d0 = *(const float2*)dp;          // (d, d * sum) of values 0..31
        const float2 d1 = *(const float2*)(dp + 1);    // and 32..63
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float s0 = (float)dot32(lo[r], x0, x1), s1 = (float)dot32(hi[r], x2, x3);
            acc[r][n] += a0[r] * d0.x * s0 - b0[r] * d0.y + a1[r] * d1.x * s1 - b1[r] * d1.y;
        }
    }
}

// The same for Q6_K: group t is super-block t / 4, group j = t % 4 = (n, i).
template <int QT, int NB, int R>
PQ_DEV void kq_q6k_step(const KqGroup<QT> (&g)[R], int t, int j, int K, const i8* __restrict__ xq,
                        const float4* __restrict__ xds, float (&acc)[R][NB]) {
    const int n = j >> 1, i = j & 1;
    const long long v0 = 256ll * (t >> 2) + 128 * n + 16 * i;     // value index of piece 0
    u32 w[R][4][4];
    float sc[R][4];
#pragma unroll
    for (int r = 0; r < R; ++r) q6k_unpack(g[r], i, w[r], sc[r]);
#pragma unroll
    for (int b = 0; b < NB; ++b) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int4 x = *(const int4*)(xq + b * (long long)K + v0 + 32 * q);
            const float4 ds = xds[b * (long long)(K / 32) + (v0 >> 5) + q];
            const float xd = ds.x, xs = 32.0f * (i ? ds.w : ds.z);   // values are q - 32: 32 * d * sum
#pragma unroll
            for (int r = 0; r < R; ++r) {
                int s = dp4a_us(w[r][q][0], x.x, 0);
                s = dp4a_us(w[r][q][1], x.y, s);
                s = dp4a_us(w[r][q][2], x.z, s);
                s = dp4a_us(w[r][q][3], x.w, s);
                acc[r][b] += sc[r][q] * (xd * (float)s - xs);
            }
        }
    }
}

// The R rows of W a warp of grid block blk owns (clamped to the last row; returns the first), their
// first bytes prefetched into L2: weights need no pdl_wait.
template <int R>
PQ_DEV int kq_rows(const u8* __restrict__ W, long long bpr, int rows, int blk, const u8* (&wr)[R]) {
    const int lane = threadIdx.x & 31;
    const int row0 = (blk * (GEMV_THREADS / 32) + (threadIdx.x >> 5)) * R;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        wr[r] = W + (long long)min(row0 + r, rows - 1) * bpr;
        if (lane * 128 < bpr) prefetch_l2_line(wr[r] + lane * 128);
    }
    return row0;
}

// Groups t0, t0 + S, ... (S = stride: 32 a warp, or a block's threads; t0 % 4 is the lane's group
// in each super-block) of rows wr[0..R) against NB activation rows, U groups in flight, into acc.
template <int QT, int NB, int R, int U>
PQ_DEV void kq_accum(const u8* const (&wr)[R], int K, int t0, int stride, const i8* __restrict__ xq,
                     const float4* __restrict__ xds, float (&acc)[R][NB]) {
    const int j = t0 & 3;
    const int ngroups = K / 64;
    for (int tb = t0; tb < ngroups; tb += stride * U) {
        KqGroup<QT> g[U][R];
#pragma unroll
        for (int i = 0; i < U; ++i) {
            const int b = min(tb + stride * i, ngroups - 1) >> 2;   // past the end: a valid group, unused
#pragma unroll
            for (int r = 0; r < R; ++r) kq_load<QT>(wr[r], b, ngroups >> 2, j, g[i][r]);
        }
#pragma unroll
        for (int i = 0; i < U; ++i) {
            const int t = tb + stride * i;
            if (U > 1 && t >= ngroups) break;
            if constexpr (IS_Q6K<QT>)
                kq_q6k_step<QT, NB, R>(g[i], t, j, K, xq, xds, acc);
            else
                kq_q45k_step<QT, NB, R>(g[i], t, j, K, xq, xds, acc);
        }
    }
}

// y[n, row] (+ bias) of the warp's rows against NB activation rows (XN: times xnorm_scale(xpart)).
template <int QT, int NB, int R, int U, bool XN>
PQ_DEV void kq_rows_dot(const u8* const (&wr)[R], int row0, int rows, int K, const i8* __restrict__ xq,
                        const float4* __restrict__ xds, const float* __restrict__ xpart,
                        const float* __restrict__ bias, float* __restrict__ y) {
    float acc[R][NB] = {};
    kq_accum<QT, NB, R, U>(wr, K, threadIdx.x & 31, 32, xq, xds, acc);
    gemv_reduce_lanes_store<NB, R, 32>(acc, row0, rows, bias, y, XN ? xnorm_scale(xpart, K) : 1.0f);
}

template <int QT, int NB, int R, int U, bool XN = false>
__global__ void __launch_bounds__(GEMV_THREADS)
gemv_kquant(const u8* __restrict__ W, long long bpr, int rows, int K, const i8* __restrict__ xq,
            const float4* __restrict__ xds, const float* __restrict__ xpart, const float* __restrict__ bias,
            float* __restrict__ y) {
    const u8* wr[R];
    const int row0 = kq_rows<R>(W, bpr, rows, blockIdx.x, wr);
    pdl_wait();
    kq_rows_dot<QT, NB, R, U, XN>(wr, row0, rows, K, xq, xds, xpart, bias, y);
}

// Long rows: a block's GEMV_THREADS threads stride over the groups of its R rows (row0 = blockIdx.x * R)
// and sum through shared memory, so a row's groups are spread over four warps' loads instead of one.
// Grid: ceil(rows / R).
template <int QT, int NB, int R, int U, bool XN = false>
__global__ void __launch_bounds__(GEMV_THREADS)
gemv_kquant_split(const u8* __restrict__ W, long long bpr, int rows, int K, const i8* __restrict__ xq,
                  const float4* __restrict__ xds, const float* __restrict__ xpart, const float* __restrict__ bias,
                  float* __restrict__ y) {
    const int row0 = blockIdx.x * R;
    const u8* wr[R];
    block_row_ptrs<R>(W, bpr, row0, rows, wr);
    pdl_wait();
    float acc[R][NB] = {};
    kq_accum<QT, NB, R, U>(wr, K, threadIdx.x, blockDim.x, xq, xds, acc);
    gemv_reduce_store<NB, R>(acc, row0, rows, bias, y, XN && threadIdx.x < 32 ? xnorm_scale(xpart, K) : 1.0f);
}

// The batch-1 GEMV with the residual-add RMSNorm of its output as epilogue (gemv_norm.cuh's
// gemv_norm_block), a group's threads striding over their 64-value groups as gemv_kquant_split's
// do. rows % 32 == 0; grid rows / 32.
template <int QT, int R, int SB>
__global__ void __launch_bounds__(32 / R * SB)
gemv_kquant_norm(const u8* __restrict__ W, long long bpr, int K, const i8* __restrict__ xq,
                 const float4* __restrict__ xds, const float* __restrict__ bias,
                 float* __restrict__ res, const float* __restrict__ w_norm, float eps, i8* __restrict__ yq,
                 float4* __restrict__ yds, float* __restrict__ ypart) {
    gemv_norm_block<R, SB>(W, bpr, bias, res, w_norm, eps, yq, yds, ypart,
                           [&](const u8* const (&wr)[R], int t, float (&acc)[R][1]) {
                               kq_accum<QT, 1, R, 1>(wr, K, t, SB, xq, xds, acc);
                           });
}

// Two or three weights of one input in one launch (q, k, v projections of mixed types, as Q4_K_M
// stores them): blocks [0, end_a) take weight a, [end_a, end_b) b, the rest c; each writes its
// own output.  One launch instead of three saves two kernel transitions a layer, and the short
// k / v matrices, latency-bound alone, ride in the grid of the long one.
#define PQ_KQ_SEG(s) const u8 *__restrict__ W##s, long long bpr_##s, int rows_##s, const float *__restrict__ bias_##s, \
                     float *__restrict__ y_##s
template <int QA, int QB, int QC, int NB, int R, bool XN = false>
__global__ void __launch_bounds__(GEMV_THREADS)
gemv_kquant3(int K, const i8* __restrict__ xq, const float4* __restrict__ xds, const float* __restrict__ xpart,
             int end_a, int end_b, PQ_KQ_SEG(a), PQ_KQ_SEG(b), PQ_KQ_SEG(c)) {
    const int blk = blockIdx.x, seg = blk < end_a ? 0 : blk < end_b ? 1 : 2;
    const int rows = seg == 0 ? rows_a : seg == 1 ? rows_b : rows_c;
    const u8* wr[R];
    const int row0 = kq_rows<R>(seg == 0 ? Wa : seg == 1 ? Wb : Wc, seg == 0 ? bpr_a : seg == 1 ? bpr_b : bpr_c, rows,
                                blk - (seg == 0 ? 0 : seg == 1 ? end_a : end_b), wr);
    pdl_wait();
    if (seg == 0)
        kq_rows_dot<QA, NB, R, 1, XN>(wr, row0, rows, K, xq, xds, xpart, bias_a, y_a);
    else if (seg == 1)
        kq_rows_dot<QB, NB, R, 1, XN>(wr, row0, rows, K, xq, xds, xpart, bias_b, y_b);
    else
        kq_rows_dot<QC, NB, R, 1, XN>(wr, row0, rows, K, xq, xds, xpart, bias_c, y_c);
}
#undef PQ_KQ_SEG

#ifndef __CUDACC_RTC__
#define PQ_INST(T, NB, R, U)                                                                          \
    template __global__ void gemv_kquant<T, NB, R, U>(const u8*, long long, int, int, const i8*,     \
                                                      const float4*, const float*, const float*, float*);
PQ_INST(Q4_K, 1, 1, 2) PQ_INST(Q5_K, 2, 2, 1) PQ_INST(Q6_K, 1, 1, 2) PQ_INST(Q6_KR, 1, 2, 1)
#undef PQ_INST
template __global__ void gemv_kquant_split<Q4_K, 1, 4, 1>(const u8*, long long, int, int, const i8*, const float4*,
                                                         const float*, const float*, float*);
template __global__ void gemv_kquant3<Q4_K, Q4_K, Q6_KR, 1, 2>(int, const i8*, const float4*, const float*, int, int,
                                                             const u8*, long long, int, const float*, float*,
                                                             const u8*, long long, int, const float*, float*,
                                                             const u8*, long long, int, const float*, float*);
template __global__ void gemv_kquant_split<Q4_K, 1, 4, 1, true>(const u8*, long long, int, int, const i8*,
                                                               const float4*, const float*, const float*, float*);
template __global__ void gemv_kquant3<Q4_K, Q4_K, Q6_KR, 1, 2, true>(int, const i8*, const float4*, const float*, int,
                                                                   int, const u8*, long long, int, const float*,
                                                                   float*, const u8*, long long, int, const float*,
                                                                   float*, const u8*, long long, int, const float*,
                                                                   float*);
#define PQ_INST_NORM(T, R, SB)                                                                            \
    template __global__ void gemv_kquant_norm<T, R, SB>(const u8*, long long, int, const i8*, const float4*, \
                                                        const float*, float*, const float*, float, i8*,     \
                                                        float4*, float*);
PQ_INST_NORM(Q4_K, 4, 128) PQ_INST_NORM(Q5_K, 2, 64) PQ_INST_NORM(Q6_KR, 2, 32) PQ_INST_NORM(Q6_K, 2, 32)
#undef PQ_INST_NORM
#endif
