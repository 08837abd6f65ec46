// The super-block step of the int8 tensor-core K-quant kernels (gemv_kquant_mma.cu, whose header
// describes the fragment layout, and gemm_kquant_tile.cu): a warp's 16-row tiles of one Q4_K /
// Q5_K / Q6_K super-block against NT 8-column tiles of per-256 int8 activations (quantize_q8k_x's
// chunk-major form), accumulated into float outputs. The weight and activation pointers may be
// global or shared memory.
#pragma once

#include "gguf_units.cuh"
#include "mma_prims.cuh"
#include "mma_tiles.cuh"

// The activations of the lane's batch columns: B fragment words at element k of column 8 * nt + g
// (zero past the batch; xq chunk-major, chunks of `cs` bytes); the scale and the eight 32-sums of
// super-block `sblk` of column 8 * nt + 2t + j. CS > 0: every column is in the batch (whole tiles)
// and the chunks are CS bytes, so a B word's address is the lane's base plus a constant: no
// bounds test and no 64-bit address arithmetic per load.
template <int NT, int CS = 0>
struct ActsK {
    const signed char* xq;
    const float* xd;
    const short* xb;
    int K, nb, g, t;
    i64 cs;

    __device__ __forceinline__ const signed char* at(int col, int k) const {
        return xq + (k >> 5) * (CS ? (i64)CS : cs) + 32 * col + (k & 31);
    }
    __device__ __forceinline__ uint2 b8(int nt, int k) const {
        const int col = 8 * nt + g;
        if constexpr (CS) return *reinterpret_cast<const uint2*>(at(col, k));
        return col < nb ? *reinterpret_cast<const uint2*>(at(col, k)) : make_uint2(0u, 0u);
    }
    __device__ __forceinline__ u32 b4(int nt, int k) const {
        const int col = 8 * nt + g;
        if constexpr (CS) return *reinterpret_cast<const u32*>(at(col, k));
        return col < nb ? *reinterpret_cast<const u32*>(at(col, k)) : 0u;
    }
    __device__ __forceinline__ int column(int nt, int j) const {
        return CS ? 8 * nt + 2 * t + j : min(8 * nt + 2 * t + j, nb - 1);
    }
    __device__ __forceinline__ float d(int nt, int j, int sblk) const {
        return xd[(i64)column(nt, j) * (K / 256) + sblk];
    }
    // the 32-sums 2t and 2t + 1 of super-block sblk of column 8 * nt + g (int16 pair; zero past the batch)
    __device__ __forceinline__ u32 sums2(int nt, int sblk) const {
        const int col = 8 * nt + g;
        if (!CS && col >= nb) return 0u;
        return *reinterpret_cast<const u32*>(xb + (i64)col * (K / 32) + 8 * sblk + 2 * t);
    }
};

__device__ __forceinline__ u32 byte_u(u32 w, int b) { return __byte_perm(w, 0u, 0x4440u | b); }
__device__ __forceinline__ int byte_s(u32 w, int b) { return (int)(signed char)((w >> (8 * b)) & 0xffu); }

// The mins' term of a Q4_K / Q5_K super-block, sum over its 8 sub-blocks of min * (32-sum of the
// activations), as one m16n8k16 whose k runs over the sub-blocks twice: A = (min, 64 min) of rows
// g / g + 8, B = (s & 63, s >> 6) of the 32-sums s (|s| <= 32 * 127), so lo + 64 hi = s and every
// product and sum is an integer below 2^24: exact in fp16 inputs and fp32 accumulators. Lane t holds
// sub-blocks 2t and 2t + 1; m_lo / m_hi are the mins of sub-blocks 0-3 / 4-7 as bytes.
__device__ __forceinline__ u32 h2_of(__half2 h) { return *reinterpret_cast<const u32*>(&h); }
__device__ __forceinline__ __half2 as_h2(u32 w) { return *reinterpret_cast<const __half2*>(&w); }

__device__ __forceinline__ void mins_frag(u32 m_lo, u32 m_hi, int t, u32& a, u32& a64) {
    const u32 b = __byte_perm(t < 2 ? m_lo : m_hi, 0x64646464u, t & 1 ? 0x4342u : 0x4140u);   // 1024 + min
    const __half2 m = __hsub2(as_h2(b), __float2half2_rn(1024.0f));
    a = h2_of(m), a64 = h2_of(__hmul2(m, __float2half2_rn(64.0f)));
}

__device__ __forceinline__ void sums_frag(u32 s, u32& lo, u32& hi) {
    const u32 l = (s & 0x003f003fu) | 0x64006400u;                               // 1024 + (s & 63)
    const u32 h = ((__vadd2(s, 0x10001000u) >> 6) & 0x007f007fu) | 0x64006400u;  // 1024 + 64 + (s >> 6)
    lo = h2_of(__hsub2(as_h2(l), __float2half2_rn(1024.0f)));
    hi = h2_of(__hsub2(as_h2(h), __float2half2_rn(1088.0f)));
}

// Rows g and g + 8 of one Q4_K / Q5_K super-block as lane t reads them: its 8 bytes of every
// 32-byte quant group (values 8t..8t+7 of two sub-blocks), the 6-bit scales and mins one byte per
// sub-block ([0..3] and [4..7], get_scale_min_k4). Q5_K: the nibbles start at 48, after qh[32],
// whose byte i holds bit 4 of value i of every sub-block sb (bit sb); lane t takes bytes 8t..8t+7.
template <int QT>
struct Kq45Rows {
    uint4 ha, hb;
    uint2 qa[4], qb[4], ha5, hb5;
    u32 sa_lo, sa_hi, ma_lo, ma_hi, sb_lo, sb_hi, mb_lo, mb_hi;

    __device__ __forceinline__ Kq45Rows(const u8* __restrict__ ra, const u8* __restrict__ rb, int t) {
        constexpr int QS = QT == pq::Q4_K ? 16 : 48;
        ha = *reinterpret_cast<const uint4*>(ra);
        hb = *reinterpret_cast<const uint4*>(rb);
        ha5 = hb5 = make_uint2(0u, 0u);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            qa[j] = *reinterpret_cast<const uint2*>(ra + QS + 32 * j + 8 * t);
            qb[j] = *reinterpret_cast<const uint2*>(rb + QS + 32 * j + 8 * t);
        }
        if constexpr (QT == pq::Q5_K) {
            ha5 = *reinterpret_cast<const uint2*>(ra + 16 + 8 * t);
            hb5 = *reinterpret_cast<const uint2*>(rb + 16 + 8 * t);
        }
        sa_lo = ha.y & 0x3f3f3f3fu, ma_lo = ha.z & 0x3f3f3f3fu;
        sa_hi = (ha.w & 0x0f0f0f0fu) | ((ha.y >> 2) & 0x30303030u);
        ma_hi = ((ha.w >> 4) & 0x0f0f0f0fu) | ((ha.z >> 2) & 0x30303030u);
        sb_lo = hb.y & 0x3f3f3f3fu, mb_lo = hb.z & 0x3f3f3f3fu;
        sb_hi = (hb.w & 0x0f0f0f0fu) | ((hb.y >> 2) & 0x30303030u);
        mb_hi = ((hb.w >> 4) & 0x0f0f0f0fu) | ((hb.z >> 2) & 0x30303030u);
    }
    // the A fragment of sub-block sb: values 0..15 (Q5_K 0..31)
    __device__ __forceinline__ void quants(int sb, u32& a0, u32& a1, u32& a2, u32& a3) const {
        const int j = sb >> 1, sh = 4 * (sb & 1);
        a0 = (qa[j].x >> sh) & 0x0f0f0f0fu, a2 = (qa[j].y >> sh) & 0x0f0f0f0fu;
        a1 = (qb[j].x >> sh) & 0x0f0f0f0fu, a3 = (qb[j].y >> sh) & 0x0f0f0f0fu;
        if constexpr (QT == pq::Q5_K) {
            a0 |= ((ha5.x >> sb) & 0x01010101u) << 4;
            a2 |= ((ha5.y >> sb) & 0x01010101u) << 4;
            a1 |= ((hb5.x >> sb) & 0x01010101u) << 4;
            a3 |= ((hb5.y >> sb) & 0x01010101u) << 4;
        }
    }
    __device__ __forceinline__ u32 scale_a(int sb) const { return byte_u(sb < 4 ? sa_lo : sa_hi, sb & 3); }
    __device__ __forceinline__ u32 scale_b(int sb) const { return byte_u(sb < 4 ? sb_lo : sb_hi, sb & 3); }
    __device__ __forceinline__ u32 min_a(int sb) const { return byte_u(sb < 4 ? ma_lo : ma_hi, sb & 3); }
    __device__ __forceinline__ u32 min_b(int sb) const { return byte_u(sb < 4 ? mb_lo : mb_hi, sb & 3); }
    __device__ __forceinline__ float d_a() const { return pq::h2f((u16)(ha.x & 0xffffu)); }
    __device__ __forceinline__ float dmin_a() const { return pq::h2f((u16)(ha.x >> 16)); }
    __device__ __forceinline__ float d_b() const { return pq::h2f((u16)(hb.x & 0xffffu)); }
    __device__ __forceinline__ float dmin_b() const { return pq::h2f((u16)(hb.x >> 16)); }
};

// ACC (Q4_K / Q5_K): the scales and mins applied inside the tensor cores' int32 accumulators rather
// than by 4 integer multiply-adds an mma and an mma of the mins a super-block: a 6-bit scale
// s = 8h + l makes two unsigned A tiles q * l and q * h (bytes <= 31 * 7: one word multiply, no
// carry), the mins a third with each sub-block's min in all its bytes, all three against the
// same B fragment and summed over the super-block's 8 sub-blocks by the mma itself; per
// super-block isum = 8 * c_h + c_l and msum = c_m.
template <int QT, int NT, int CS>
__device__ __forceinline__ void kquant_superblock_acc(const u8* __restrict__ ra, const u8* __restrict__ rb, int sblk,
                                                      const ActsK<NT, CS>& x, float (&acc)[NT][1][4]) {
    static_assert(QT == pq::Q4_K || QT == pq::Q5_K, "ACC: Q4_K / Q5_K");
    const int t = x.t, kb = 256 * sblk;
    const Kq45Rows<QT> w(ra, rb, t);
    int cl[NT][4], ch[NT][4], cm[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) cl[nt][i] = ch[nt][i] = cm[nt][i] = 0;
#pragma unroll
    for (int sb = 0; sb < 8; ++sb) {
        u32 a0, a1, a2, a3;
        w.quants(sb, a0, a1, a2, a3);
        const u32 sca = w.scale_a(sb), scb = w.scale_b(sb);
        const u32 la = sca & 7u, hia = sca >> 3, lb = scb & 7u, hib = scb >> 3;
        const u32 mna = w.min_a(sb) * 0x01010101u, mnb = w.min_b(sb) * 0x01010101u;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const uint2 xb = x.b8(nt, kb + 32 * sb + 8 * t);
            mma_u8s8_16832(cl[nt], a0 * la, a1 * lb, a2 * la, a3 * lb, xb.x, xb.y);
            mma_u8s8_16832(ch[nt], a0 * hia, a1 * hib, a2 * hia, a3 * hib, xb.x, xb.y);
            mma_u8s8_16832(cm[nt], mna, mnb, mna, mnb, xb.x, xb.y);
        }
    }
    const float da = w.d_a(), ma = w.dmin_a(), db = w.d_b(), mb = w.dmin_b();
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const float x0 = x.d(nt, 0, sblk), x1 = x.d(nt, 1, sblk);
        acc[nt][0][0] += x0 * (da * (float)(8 * ch[nt][0] + cl[nt][0]) - ma * (float)cm[nt][0]);
        acc[nt][0][1] += x1 * (da * (float)(8 * ch[nt][1] + cl[nt][1]) - ma * (float)cm[nt][1]);
        acc[nt][0][2] += x0 * (db * (float)(8 * ch[nt][2] + cl[nt][2]) - mb * (float)cm[nt][2]);
        acc[nt][0][3] += x1 * (db * (float)(8 * ch[nt][3] + cl[nt][3]) - mb * (float)cm[nt][3]);
    }
}

// MT: 16-row tiles a warp holds at once (ra_ / rb_: each tile's rows g and g + 8 at the super-block;
// da_ / db_: where their fp16 d lies, block_d, read by the Q6_K types only), so that every B fragment
// and activation scale loaded serves MT mma. (The Q4_K / Q5_K branch keeps
// its own copy of Kq45Rows' code: built on the struct, ptxas spilled more at 2 tiles, 5 stores a
// thread.)
template <int QT, int NT, int CS, int MT>
__device__ __forceinline__ void kquant_superblock_k(const u8* const (&ra_)[MT], const u8* const (&rb_)[MT],
                                                    const u8* const (&da_)[MT], const u8* const (&db_)[MT],
                                                    int sblk, const ActsK<NT, CS>& x, float (&acc)[NT][MT][4]) {
    const int t = x.t, kb = 256 * sblk;
    int isum[NT][MT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int m = 0; m < MT; ++m) isum[nt][m][0] = isum[nt][m][1] = isum[nt][m][2] = isum[nt][m][3] = 0;
    if constexpr (QT == pq::Q4_K || QT == pq::Q5_K) {
        // Q5_K: the nibbles start at 48, after qh[32], whose byte i holds bit 4 of value i of every
        // sub-block sb (bit sb); lane t's values 8t..8t+7 take bytes 8t..8t+7 (ha5, hb5)
        constexpr int QS = QT == pq::Q4_K ? 16 : 48;
        uint4 ha[MT], hb[MT];
        uint2 qa[MT][4], qb[MT][4], ha5[MT], hb5[MT];
        u32 sa_lo[MT], sa_hi[MT], ma_lo[MT], ma_hi[MT], sb_lo[MT], sb_hi[MT], mb_lo[MT], mb_hi[MT];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            const u8* __restrict__ ra = ra_[m];
            const u8* __restrict__ rb = rb_[m];
            ha[m] = *reinterpret_cast<const uint4*>(ra), hb[m] = *reinterpret_cast<const uint4*>(rb);
            ha5[m] = hb5[m] = make_uint2(0u, 0u);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                qa[m][j] = *reinterpret_cast<const uint2*>(ra + QS + 32 * j + 8 * t);
                qb[m][j] = *reinterpret_cast<const uint2*>(rb + QS + 32 * j + 8 * t);
            }
            if constexpr (QT == pq::Q5_K) {
                ha5[m] = *reinterpret_cast<const uint2*>(ra + 16 + 8 * t);
                hb5[m] = *reinterpret_cast<const uint2*>(rb + 16 + 8 * t);
            }
            // 6-bit scales and mins, one byte per sub-block: [0..3] and [4..7] (get_scale_min_k4)
            sa_lo[m] = ha[m].y & 0x3f3f3f3fu, ma_lo[m] = ha[m].z & 0x3f3f3f3fu;
            sa_hi[m] = (ha[m].w & 0x0f0f0f0fu) | ((ha[m].y >> 2) & 0x30303030u);
            ma_hi[m] = ((ha[m].w >> 4) & 0x0f0f0f0fu) | ((ha[m].z >> 2) & 0x30303030u);
            sb_lo[m] = hb[m].y & 0x3f3f3f3fu, mb_lo[m] = hb[m].z & 0x3f3f3f3fu;
            sb_hi[m] = (hb[m].w & 0x0f0f0f0fu) | ((hb[m].y >> 2) & 0x30303030u);
            mb_hi[m] = ((hb[m].w >> 4) & 0x0f0f0f0fu) | ((hb[m].z >> 2) & 0x30303030u);
        }
#pragma unroll
        for (int sb = 0; sb < 8; ++sb) {
            const int j = sb >> 1, sh = 4 * (sb & 1);
            u32 a0[MT], a1[MT], a2[MT], a3[MT];
            int sca[MT], scb[MT];
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                a0[m] = (qa[m][j].x >> sh) & 0x0f0f0f0fu, a2[m] = (qa[m][j].y >> sh) & 0x0f0f0f0fu;
                a1[m] = (qb[m][j].x >> sh) & 0x0f0f0f0fu, a3[m] = (qb[m][j].y >> sh) & 0x0f0f0f0fu;
                if constexpr (QT == pq::Q5_K) {
                    a0[m] |= ((ha5[m].x >> sb) & 0x01010101u) << 4;
                    a2[m] |= ((ha5[m].y >> sb) & 0x01010101u) << 4;
                    a1[m] |= ((hb5[m].x >> sb) & 0x01010101u) << 4;
                    a3[m] |= ((hb5[m].y >> sb) & 0x01010101u) << 4;
                }
                sca[m] = (int)byte_u(sb < 4 ? sa_lo[m] : sa_hi[m], sb & 3);
                scb[m] = (int)byte_u(sb < 4 ? sb_lo[m] : sb_hi[m], sb & 3);
            }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const uint2 xb = x.b8(nt, kb + 32 * sb + 8 * t);
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    int c[4] = {0, 0, 0, 0};
                    mma_s8_16832(c, a0[m], a1[m], a2[m], a3[m], xb.x, xb.y);
                    isum[nt][m][0] += sca[m] * c[0];
                    isum[nt][m][1] += sca[m] * c[1];
                    isum[nt][m][2] += scb[m] * c[2];
                    isum[nt][m][3] += scb[m] * c[3];
                }
            }
        }
        float da[MT], ma[MT], db[MT], mb[MT];
        u32 am[MT][4];   // the mins' A fragment: (g, 2t..), (g + 8, 2t..), then 64x each
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            da[m] = pq::h2f((u16)(ha[m].x & 0xffffu)), ma[m] = pq::h2f((u16)(ha[m].x >> 16));
            db[m] = pq::h2f((u16)(hb[m].x & 0xffffu)), mb[m] = pq::h2f((u16)(hb[m].x >> 16));
            mins_frag(ma_lo[m], ma_hi[m], t, am[m][0], am[m][2]);
            mins_frag(mb_lo[m], mb_hi[m], t, am[m][1], am[m][3]);
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            u32 lo, hi;
            sums_frag(x.sums2(nt, sblk), lo, hi);
            const float x0 = x.d(nt, 0, sblk), x1 = x.d(nt, 1, sblk);
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                mma_16816(c, am[m], lo, hi);
                acc[nt][m][0] += x0 * (da[m] * (float)isum[nt][m][0] - ma[m] * c[0]);
                acc[nt][m][1] += x1 * (da[m] * (float)isum[nt][m][1] - ma[m] * c[1]);
                acc[nt][m][2] += x0 * (db[m] * (float)isum[nt][m][2] - mb[m] * c[2]);
                acc[nt][m][3] += x1 * (db[m] * (float)isum[nt][m][3] - mb[m] * c[3]);
            }
        }
    } else {   // Q6_K: ql[128], qh[64], int8 scales[16], fp16 d
        u32 sa[MT][4], sbw[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            if constexpr (QT == pq::Q6_KR) {
                pq::ld16b<1>(ra_[m] + 192, sa[m]);
                pq::ld16b<1>(rb_[m] + 192, sbw[m]);
            } else {
                pq::ldu<4>(ra_[m] + 192, sa[m]);
                pq::ldu<4>(rb_[m] + 192, sbw[m]);
            }
        }
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
            for (int lh = 0; lh < 2; ++lh) {
                const int l = 16 * lh + 4 * t;
                u32 qla0[MT], qla1[MT], qlb0[MT], qlb1[MT], qha[MT], qhb[MT];
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    const u8* __restrict__ ra = ra_[m];
                    const u8* __restrict__ rb = rb_[m];
                    qla0[m] = pq::ld32_q6<QT>(ra + 64 * n + l), qla1[m] = pq::ld32_q6<QT>(ra + 64 * n + 32 + l);
                    qlb0[m] = pq::ld32_q6<QT>(rb + 64 * n + l), qlb1[m] = pq::ld32_q6<QT>(rb + 64 * n + 32 + l);
                    qha[m] = pq::ld32_q6<QT>(ra + 128 + 32 * n + l), qhb[m] = pq::ld32_q6<QT>(rb + 128 + 32 * n + l);
                }
#pragma unroll
                for (int qq = 0; qq < 4; ++qq) {   // values 128n + 32qq + l .. +3
                    const int ls = 4 * (qq >> 1), hs = 2 * qq;
                    const int si = 8 * n + lh + 2 * qq;                       // scale index
                    u32 wa[MT], wb[MT];
                    int sca[MT], scb[MT];
#pragma unroll
                    for (int m = 0; m < MT; ++m) {
                        const u32 la = qq & 1 ? qla1[m] : qla0[m], lb = qq & 1 ? qlb1[m] : qlb0[m];
                        wa[m] = pq::vsub4(((la >> ls) & 0x0f0f0f0fu) | (((qha[m] >> hs) & 0x03030303u) << 4), 0x20202020u);
                        wb[m] = pq::vsub4(((lb >> ls) & 0x0f0f0f0fu) | (((qhb[m] >> hs) & 0x03030303u) << 4), 0x20202020u);
                        sca[m] = byte_s(sa[m][si >> 2], si & 3), scb[m] = byte_s(sbw[m][si >> 2], si & 3);
                    }
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
                        const u32 xb = x.b4(nt, kb + 128 * n + 32 * qq + l);
#pragma unroll
                        for (int m = 0; m < MT; ++m) {
                            int c[4] = {0, 0, 0, 0};
                            mma_s8_16816(c, wa[m], wb[m], xb);
                            isum[nt][m][0] += sca[m] * c[0];
                            isum[nt][m][1] += sca[m] * c[1];
                            isum[nt][m][2] += scb[m] * c[2];
                            isum[nt][m][3] += scb[m] * c[3];
                        }
                    }
                }
            }
        }
        float da[MT], db[MT];
#pragma unroll
        for (int m = 0; m < MT; ++m)
            da[m] = pq::h2f(pq::ld16(da_[m])), db[m] = pq::h2f(pq::ld16(db_[m]));
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const float x0 = x.d(nt, 0, sblk), x1 = x.d(nt, 1, sblk);
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                acc[nt][m][0] += x0 * da[m] * (float)isum[nt][m][0];
                acc[nt][m][1] += x1 * da[m] * (float)isum[nt][m][1];
                acc[nt][m][2] += x0 * db[m] * (float)isum[nt][m][2];
                acc[nt][m][3] += x1 * db[m] * (float)isum[nt][m][3];
            }
        }
    }
}

// The super-block step of a launch (ra / rb: the tiles' rows at their first byte): ACC's on Q4_K /
// Q5_K weights (other types ignore ACC; ACC holds one row tile).
template <int QT, int NT, int ACC, int CS, int MT>
__device__ __forceinline__ void kquant_superblock(const u8* const (&ra)[MT], const u8* const (&rb)[MT], int sblk,
                                                  const ActsK<NT, CS>& x, float (&acc)[NT][MT][4]) {
    if constexpr (ACC && (QT == pq::Q4_K || QT == pq::Q5_K)) {
        static_assert(MT == 1, "ACC: one row tile a warp");
        kquant_superblock_acc<QT, NT, CS>(pq::block_at<QT>(ra[0], sblk), pq::block_at<QT>(rb[0], sblk), sblk, x, acc);
    } else {
        const u8* pa[MT];
        const u8* pb[MT];
        const u8* qa[MT];
        const u8* qb[MT];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            pa[m] = pq::block_at<QT>(ra[m], sblk), pb[m] = pq::block_at<QT>(rb[m], sblk);
            qa[m] = pq::block_d<QT>(ra[m], x.K / 256, sblk), qb[m] = pq::block_d<QT>(rb[m], x.K / 256, sblk);
        }
        kquant_superblock_k<QT, NT, CS, MT>(pa, pb, qa, qb, sblk, x, acc);
    }
}

