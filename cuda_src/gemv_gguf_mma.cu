// Q4_K / Q6_K linear for decode batches 2-32 on int8 tensor cores (sm_80+): the weights, unpacked
// from their raw GGUF blocks to int8, are the 16-row A tile of mma.sync (m16n8k32 over a Q4_K
// sub-block of 32 values, m16n8k16 over a Q6_K group of 16), the batch's int8 activations
// (quantize_q8_x's blocks of 32) the 8 columns of each of NT B tiles; each tile's int32 result
// is scaled by the weight's and the activations' block scales into fp32 accumulators.  The
// weights are read once for the whole batch (H200, 14336x4096 at batch 8: 1.19 TB/s, the DP4A
// GEMV 0.59).  With 8 tiles (batch 64) the per-tile scaling made it slower than dequantization
// + cuBLAS, so the launcher stops at 4.
//
// gemv_gguf_mma<QT, NT>: block of KM_WARPS warps on the same 16 rows, each warp a strided share of
// the row's 256-value super-blocks, partial tiles summed through shared memory.  Lane (g, t) =
// (lane / 4, lane % 4) holds rows g and g + 8 and batch columns 2t, 2t + 1 of every tile.
// Q4_K: lane t reads bytes 8t..8t+7 of each 32-byte quant group (values 8t..8t+7 of its two
// sub-blocks: low and high nibbles), the B fragment the same 8 activations -- a permutation of
// k that A and B share.  Q6_K: lane t reads values 4t..4t+3 of each group of 16.
// Grid: ceil(rows / 16).  Needs K % 256 == 0 and batch <= 8 * NT.
#include "gguf_units.cuh"
#include "mma_prims.cuh"

#define KM_WARPS 8

// One u32 of a Q6_K block at a 4-byte aligned offset: aligned in Q6_KP's 224-byte blocks, only
// 2-byte aligned in raw 210-byte ones.
template <int QT>
__device__ __forceinline__ u32 ld32_q6(const u8* p) {
    if constexpr (QT == pq::Q6_KP) return *reinterpret_cast<const u32*>(p);
    u32 w;
    pq::ldu<1>(p, &w);
    return w;
}

// The activations of the lane's batch columns: B fragment words at element `k` of column 8 * nt + g
// (zero past the batch), and the (d, d * sum) of 32-block `blk32` of columns 8 * nt + 2t and + 1.
template <int NT>
struct Acts {
    const signed char* xq;
    const float4* xds;
    int K, nb, g, t;

    __device__ __forceinline__ uint2 b8(int nt, int k) const {      // 8 int8 at k (k % 8 == 0)
        const int col = 8 * nt + g;
        return col < nb ? *reinterpret_cast<const uint2*>(xq + (i64)col * K + k) : make_uint2(0u, 0u);
    }
    __device__ __forceinline__ u32 b4(int nt, int k) const {         // 4 int8 at k (k % 4 == 0)
        const int col = 8 * nt + g;
        return col < nb ? *reinterpret_cast<const u32*>(xq + (i64)col * K + k) : 0u;
    }
    __device__ __forceinline__ float2 ds(int nt, int j, int blk32) const {   // column 8nt + 2t + j
        const int col = min(8 * nt + 2 * t + j, nb - 1);
        const float4 v = xds[(i64)col * (K / 32) + blk32];
        return make_float2(v.x, v.y);
    }
};

template <int QT, int NT>
__device__ __forceinline__ void kquant_superblock(const u8* __restrict__ ra, const u8* __restrict__ rb, int kb,
                                                  const Acts<NT>& x, float (&acc)[NT][4]) {
    const int t = x.t;
    if constexpr (QT == pq::Q4_K) {
        const uint4 ha = *reinterpret_cast<const uint4*>(ra), hb = *reinterpret_cast<const uint4*>(rb);
        uint2 qa[4], qb[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            qa[j] = *reinterpret_cast<const uint2*>(ra + 16 + 32 * j + 8 * t);
            qb[j] = *reinterpret_cast<const uint2*>(rb + 16 + 32 * j + 8 * t);
        }
        const float da = pq::h2f((u16)(ha.x & 0xffffu)), ma = pq::h2f((u16)(ha.x >> 16));
        const float db = pq::h2f((u16)(hb.x & 0xffffu)), mb = pq::h2f((u16)(hb.x >> 16));
#pragma unroll
        for (int sb = 0; sb < 8; ++sb) {
            const int j = sb >> 1, sh = 4 * (sb & 1);
            const u32 a0 = (qa[j].x >> sh) & 0x0f0f0f0fu, a2 = (qa[j].y >> sh) & 0x0f0f0f0fu;
            const u32 a1 = (qb[j].x >> sh) & 0x0f0f0f0fu, a3 = (qb[j].y >> sh) & 0x0f0f0f0fu;
            float sca, mna, scb, mnb;
            pq::scale_min_k4(ha.y, ha.z, ha.w, sb, sca, mna);
            pq::scale_min_k4(hb.y, hb.z, hb.w, sb, scb, mnb);
            const float fa = da * sca, ga = ma * mna, fb = db * scb, gb = mb * mnb;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const uint2 xb = x.b8(nt, kb + 32 * sb + 8 * t);
                int c[4] = {0, 0, 0, 0};
                mma_s8_16832(c, a0, a1, a2, a3, xb.x, xb.y);
                const float2 s0 = x.ds(nt, 0, kb / 32 + sb), s1 = x.ds(nt, 1, kb / 32 + sb);
                acc[nt][0] += fa * s0.x * (float)c[0] - ga * s0.y;
                acc[nt][1] += fa * s1.x * (float)c[1] - ga * s1.y;
                acc[nt][2] += fb * s0.x * (float)c[2] - gb * s0.y;
                acc[nt][3] += fb * s1.x * (float)c[3] - gb * s1.y;
            }
        }
    } else {   // Q6_K: ql[128], qh[64], int8 scales[16], fp16 d
        u32 sa[4], sbw[4];
        if constexpr (QT == pq::Q6_KP) {
            pq::ld16b<1>(ra + 192, sa);
            pq::ld16b<1>(rb + 192, sbw);
        } else {
            pq::ldu<4>(ra + 192, sa);
            pq::ldu<4>(rb + 192, sbw);
        }
        const float da = pq::h2f(pq::ld16(ra + 208)), db = pq::h2f(pq::ld16(rb + 208));
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
            for (int lh = 0; lh < 2; ++lh) {
                const int l = 16 * lh + 4 * t;
                const u32 qla0 = ld32_q6<QT>(ra + 64 * n + l), qla1 = ld32_q6<QT>(ra + 64 * n + 32 + l);
                const u32 qlb0 = ld32_q6<QT>(rb + 64 * n + l), qlb1 = ld32_q6<QT>(rb + 64 * n + 32 + l);
                const u32 qha = ld32_q6<QT>(ra + 128 + 32 * n + l), qhb = ld32_q6<QT>(rb + 128 + 32 * n + l);
#pragma unroll
                for (int qq = 0; qq < 4; ++qq) {   // values 128n + 32qq + l .. +3
                    const u32 la = qq & 1 ? qla1 : qla0, lb = qq & 1 ? qlb1 : qlb0;
                    const int ls = 4 * (qq >> 1), hs = 2 * qq;
                    const u32 wa = pq::vsub4(((la >> ls) & 0x0f0f0f0fu) | (((qha >> hs) & 0x03030303u) << 4), 0x20202020u);
                    const u32 wb = pq::vsub4(((lb >> ls) & 0x0f0f0f0fu) | (((qhb >> hs) & 0x03030303u) << 4), 0x20202020u);
                    const int si = 8 * n + lh + 2 * qq;                       // scale index
                    const float fa = da * (float)(signed char)((sa[si >> 2] >> (8 * (si & 3))) & 0xffu);
                    const float fb = db * (float)(signed char)((sbw[si >> 2] >> (8 * (si & 3))) & 0xffu);
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
                        int c[4] = {0, 0, 0, 0};
                        mma_s8_16816(c, wa, wb, x.b4(nt, kb + 128 * n + 32 * qq + l));
                        const int b32 = kb / 32 + 4 * n + qq;
                        const float x0 = x.ds(nt, 0, b32).x, x1 = x.ds(nt, 1, b32).x;
                        acc[nt][0] += fa * x0 * (float)c[0];
                        acc[nt][1] += fa * x1 * (float)c[1];
                        acc[nt][2] += fb * x0 * (float)c[2];
                        acc[nt][3] += fb * x1 * (float)c[3];
                    }
                }
            }
        }
    }
}

template <int QT, int NT>
__global__ void __launch_bounds__(KM_WARPS * 32, NT <= 2 ? 2 : 1)   // NT 4: 216-255 registers
gemv_gguf_mma(const u8* __restrict__ W, long long bpr, int rows, int K, const signed char* __restrict__ xq,
              const float4* __restrict__ xds, int nb, const float* __restrict__ bias, float* __restrict__ y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int TS = pq::QTraits<QT>::TS;
    __shared__ float red[KM_WARPS - 1][NT * 4][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 16;
    const u8* ra = W + (i64)min(row0 + g, rows - 1) * bpr;
    const u8* rb = W + (i64)min(row0 + g + 8, rows - 1) * bpr;
    prefetch_l2(W + (i64)row0 * bpr, bpr * (min(rows, row0 + 16) - row0));
    pdl_wait();
    const Acts<NT> x{xq, xds, K, nb, g, t};
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    const int nblk = K / 256;
    for (int b = warp; b < nblk; b += KM_WARPS)
        kquant_superblock<QT, NT>(ra + (i64)b * TS, rb + (i64)b * TS, 256 * b, x, acc);
    if (warp > 0) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) red[warp - 1][4 * nt + i][lane] = acc[nt][i];
    }
    __syncthreads();
    if (warp > 0) return;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float v = acc[nt][i];
#pragma unroll
            for (int w = 0; w < KM_WARPS - 1; ++w) v += red[w][4 * nt + i][lane];
            const int row = row0 + g + 8 * (i >> 1), col = 8 * nt + 2 * t + (i & 1);   // c fragment layout
            if (row < rows && col < nb) y[(i64)col * rows + row] = bias ? v + bias[row] : v;
        }
    }
#else
    pdl_wait();
#endif
}

#ifndef __CUDACC_RTC__
#define PQ_INST(T, N)                                                                                       \
    template __global__ void gemv_gguf_mma<T, N>(const u8*, long long, int, int, const signed char*,        \
                                                 const float4*, int, const float*, float*);
PQ_INST(pq::Q4_K, 1) PQ_INST(pq::Q4_K, 2) PQ_INST(pq::Q4_K, 4)
PQ_INST(pq::Q6_K, 1) PQ_INST(pq::Q6_K, 2) PQ_INST(pq::Q6_K, 4)
PQ_INST(pq::Q6_KP, 1) PQ_INST(pq::Q6_KP, 2) PQ_INST(pq::Q6_KP, 4)
#undef PQ_INST
#endif
