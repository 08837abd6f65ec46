// GGUF block decoding in 32-value units, shared by the GEMV (gemv_gguf.cu) and the
// dequantizers (dequant.cu).  Block layouts follow ggml-common.h / gguf/quants.py.
//
// Every type is cut into QK/32 units of 32 values.  A unit is two 16-value segments at
// element offsets p0, p1 inside the block; value t of segment s is
//     a_s * (int8) byte t of w[4s .. 4s+3]  +  b_s
// so one dp4a loop against int8 activations (plus b_s times the activation sum) serves
// every type, and dequantization is the same formula in floats.
#pragma once

#include "gguf_prims.cuh"
#include "gguf_tables.cuh"
#ifndef PQ_HOST_SHIM
#include "pdl.cuh"
#endif

namespace pq {

// ggml type ids (gguf GGMLQuantizationType)
enum {
    Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q2_K = 10, Q3_K = 11, Q4_K = 12,
    Q5_K = 13, Q6_K = 14, IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21,
    IQ2_S = 22, IQ4_XS = 23, IQ1_M = 29,
    Q6_KR = 115     // ours, as Q6_K is uploaded: runs of 8 blocks' first 208 bytes, then their fp16 d's (block_at)
};

template <int QT> constexpr bool IS_Q6K = QT == Q6_K || QT == Q6_KR;

template <int QT> struct QTraits;
// QK values per block, TS bytes per block, MIN: segments have an additive b, TAB: words of
// lookup table the decoder reads through its `tab` pointer (kernels stage it in shared memory)
#define PQ_TRAITS(T, qk, ts, mn, tab) \
    template <> struct QTraits<T> { enum { QK = qk, TS = ts, MIN = mn, TAB = tab }; };
PQ_TRAITS(Q4_0, 32, 18, 0, 0)
PQ_TRAITS(Q4_1, 32, 20, 1, 0)
PQ_TRAITS(Q5_0, 32, 22, 0, 0)
PQ_TRAITS(Q5_1, 32, 24, 1, 0)
PQ_TRAITS(Q8_0, 32, 34, 0, 0)
PQ_TRAITS(Q2_K, 256, 84, 1, 0)
PQ_TRAITS(Q3_K, 256, 110, 0, 0)
PQ_TRAITS(Q4_K, 256, 144, 1, 0)
PQ_TRAITS(Q5_K, 256, 176, 1, 0)
PQ_TRAITS(Q6_K, 256, 210, 0, 0)
PQ_TRAITS(Q6_KR, 256, 208, 0, 0)   // TS: a block's bytes without its d (block_at, block_d)
PQ_TRAITS(IQ2_XXS, 256, 66, 0, 512)
PQ_TRAITS(IQ2_XS, 256, 74, 0, 1024)
PQ_TRAITS(IQ2_S, 256, 82, 0, 2048)
PQ_TRAITS(IQ3_XXS, 256, 98, 0, 256)
PQ_TRAITS(IQ3_S, 256, 110, 0, 512)
PQ_TRAITS(IQ4_NL, 32, 18, 0, 0)
PQ_TRAITS(IQ4_XS, 256, 136, 0, 0)
PQ_TRAITS(IQ1_S, 256, 50, 0, 1024)
PQ_TRAITS(IQ1_M, 256, 56, 0, 1024)
#undef PQ_TRAITS

// One u32 of a Q6_K block at a 4-byte aligned offset: aligned in Q6_KR's 208-byte blocks (rows
// start 16-byte aligned), only 2-byte aligned in raw 210-byte ones.
template <int QT>
PQ_DEV u32 ld32_q6(const u8* p) {
    if constexpr (QT == Q6_KR) return *reinterpret_cast<const u32*>(p);
    u32 w;
    ldu<1>(p, &w);
    return w;
}

template <int QT>
PQ_DEV const u32* table_src() {
    if constexpr (QT == IQ2_XXS) return IQ2XXS_GRID;
    else if constexpr (QT == IQ2_XS) return IQ2XS_GRID;
    else if constexpr (QT == IQ2_S) return IQ2S_GRID;
    else if constexpr (QT == IQ3_XXS) return IQ3XXS_GRID;
    else if constexpr (QT == IQ3_S) return IQ3S_GRID;
    else if constexpr (QT == IQ1_S || QT == IQ1_M) return IQ1S_GRID;
    else return nullptr;
}

#ifndef PQ_HOST_SHIM
// IQ grids staged in shared memory (a no-op for the other types); returns the table pointer the
// decoders read. The whole block calls it.
template <int QT>
PQ_DEV const u32* stage_table(u32* tab_s) {
    if constexpr (QTraits<QT>::TAB > 0) {
        const u32* src = table_src<QT>();
        for (int i = threadIdx.x; i < QTraits<QT>::TAB; i += blockDim.x) tab_s[i] = src[i];
        __syncthreads();
        return tab_s;
    } else {
        return nullptr;
    }
}

// Rows row0 .. row0 + R - 1 of W (the last row repeated past the end: loaded, never stored)
template <int R>
PQ_DEV void row_ptrs(const u8* W, long long bpr, int row0, int rows, const u8* (&wr)[R]) {
#pragma unroll
    for (int r = 0; r < R; ++r) wr[r] = W + (long long)min(row0 + r, rows - 1) * bpr;
}

// row_ptrs for a GEMV block's R consecutive rows from row0 (< rows), their first bytes prefetched into
// L2 before the block's pdl_wait (prefetch_l2: weights need no wait)
template <int R>
PQ_DEV void block_row_ptrs(const u8* W, long long bpr, int row0, int rows, const u8* (&wr)[R]) {
    row_ptrs<R>(W, bpr, row0, rows, wr);
    prefetch_l2(W + (long long)row0 * bpr, bpr * (min(rows, row0 + R) - row0));
}
#endif

struct Unit {
    u32 w[8];
    float a0, a1, b0, b1;
};

// element offsets of unit `sub`'s two segments inside its block
template <int QT>
PQ_DEV void unit_pos(int sub, int& p0, int& p1) {
    if constexpr (QT == Q4_K || QT == Q5_K) {   // group j: low nibbles then high nibbles
        const int j = sub >> 1, h = sub & 1;
        p0 = 64 * j + 16 * h;
        p1 = p0 + 32;
    } else {
        p0 = 32 * sub;
        p1 = p0 + 16;
    }
}

PQ_DEV u32 byte_of(u32 w0, u32 w1, u32 w2, int b) {   // byte b (0..11) of three words
    const u32 w = b < 4 ? w0 : (b < 8 ? w1 : w2);
    return (w >> (8 * (b & 3))) & 0xffu;
}

// 6-bit scale and min of sub-block b (0..7) of Q4_K / Q5_K (get_scale_min_k4)
PQ_DEV void scale_min_k4(u32 w0, u32 w1, u32 w2, int b, float& sc, float& mn) {
    u32 s, m;
    if (b < 4) {
        s = byte_of(w0, w1, w2, b) & 63u;
        m = byte_of(w0, w1, w2, b + 4) & 63u;
    } else {
        const u32 x = byte_of(w0, w1, w2, b + 4);
        s = (x & 0xfu) | ((byte_of(w0, w1, w2, b - 4) >> 6) << 4);
        m = (x >> 4) | ((byte_of(w0, w1, w2, b) >> 6) << 4);
    }
    sc = (float)s;
    mn = (float)m;
}

// signed 6-bit scale s (0..15) of Q3_K
PQ_DEV float scale_q3k(u32 w0, u32 w1, u32 w2, int s) {
    const u32 lo = (byte_of(w0, w1, w2, s & 7) >> (4 * (s >> 3))) & 0xfu;
    const u32 hi = (byte_of(w0, w1, w2, 8 + (s & 3)) >> (2 * (s >> 2))) & 3u;
    return (float)((int)(lo | (hi << 4)) - 32);
}

// Where block b of a row (its first byte) lies, and its fp16 d (nblk blocks a row). Q6_KR is Q6_K
// as uploaded: a row's blocks in runs of 8, each run the blocks' first 208 bytes (ql, qh, scales)
// and then their 8 d's, 1,680 bytes (every block 16-byte aligned, nothing added, and a run's d's
// right after its blocks: one stream a row); the last run may be shorter, the row rounded up to
// 16 bytes. The other types keep their scales in the block (block_d: Q6_K's d).
template <int QT> constexpr int BLOCK_ROW_BYTES = QT == Q6_KR ? 210 : QTraits<QT>::TS;   // in its row, d included

template <int QT>
PQ_DEV const u8* block_at(const u8* row, int b) {
    if constexpr (QT == Q6_KR) return row + (long long)b * 208 + (b >> 3) * 16;
    else return row + (long long)b * QTraits<QT>::TS;
}

template <int QT>
PQ_DEV const u8* block_d(const u8* row, int nblk, int b) {
    if constexpr (QT == Q6_KR) {
        const int r0 = b & ~7, run = nblk - r0 < 8 ? nblk - r0 : 8;
        return row + (long long)r0 * 210 + run * 208 + 2 * (b & 7);
    } else {
        return block_at<QT>(row, b) + 208;
    }
}

// IQ1 grid entry gi (8 values v of -1, 0, 1; 2-bit codes in tab) as 8 int8 values 8 v + 1 (delta
// +1/8) or 8 v - 1 (-1/8): the unit's scale is the block's / 8, so the delta needs no additive term
PQ_DEV void iq1_entry(const u32* __restrict__ tab, u32 gi, bool minus, u32& lo, u32& hi) {
    const u32 h = (tab[gi >> 1] >> (16 * (gi & 1))) & 0xffffu;
    const u32 off = minus ? 0x09090909u : 0x07070707u;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const u32 x = (h >> (8 * k)) & 0xffu;
        const u32 codes = (x & 3u) | ((x & 0xcu) << 6) | ((x & 0x30u) << 12) | ((x & 0xc0u) << 18);
        (k ? hi : lo) = vsub4(codes << 3, off);
    }
}

// Unit `sub` of the block at blk into u; dq: the block's d (block_d; read by the Q6_K types only).
template <int QT>
PQ_DEV void decode(const u8* __restrict__ blk, const u8* __restrict__ dq, int sub, const u32* __restrict__ tab,
                   Unit& u) {
    u.b0 = u.b1 = 0.0f;
    if constexpr (QT == Q4_0 || QT == Q4_1 || QT == Q5_1) {
        u32 q[4], qh = 0;
        float d, m = 0.0f;
        if constexpr (QT == Q4_0) {
            ldu<4>(blk + 2, q);
            d = h2f(ld16(blk));
        } else {
            const int off = QT == Q4_1 ? 4 : 8;
            for (int i = 0; i < 4; ++i) q[i] = ld32(blk + off + 4 * i);
            d = h2f(ld16(blk));
            m = h2f(ld16(blk + 2));
            if constexpr (QT == Q5_1) qh = ld32(blk + 4);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            u32 lo = q[i] & 0x0f0f0f0fu, hi = (q[i] >> 4) & 0x0f0f0f0fu;
            if constexpr (QT == Q5_1) {
                lo |= bits_to_b4(qh >> (4 * i));
                hi |= bits_to_b4(qh >> (16 + 4 * i));
            }
            if constexpr (QT == Q4_0) {
                lo = vsub4(lo, 0x08080808u);
                hi = vsub4(hi, 0x08080808u);
            }
            u.w[i] = lo;
            u.w[4 + i] = hi;
        }
        u.a0 = u.a1 = d;
        u.b0 = u.b1 = m;
    } else if constexpr (QT == Q5_0) {
        u32 r[5];
        ldu<5>(blk + 2, r);              // qh, then qs[16]
        const float d = h2f(ld16(blk));
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 lo = (r[1 + i] & 0x0f0f0f0fu) | bits_to_b4(r[0] >> (4 * i));
            const u32 hi = ((r[1 + i] >> 4) & 0x0f0f0f0fu) | bits_to_b4(r[0] >> (16 + 4 * i));
            u.w[i] = vsub4(lo, 0x10101010u);
            u.w[4 + i] = vsub4(hi, 0x10101010u);
        }
        u.a0 = u.a1 = d;
    } else if constexpr (QT == Q8_0) {
        ldu<8>(blk + 2, u.w);
        u.a0 = u.a1 = h2f(ld16(blk));
    } else if constexpr (QT == Q2_K) {
        const int H = sub >> 2, k = sub & 3;
        const u8* qs = blk + 16 + 32 * H;
#pragma unroll
        for (int i = 0; i < 8; ++i) u.w[i] = (ld32(qs + 4 * i) >> (2 * k)) & 0x03030303u;
        const u32 sc = ld16(blk + 2 * sub);
        const float d = h2f(ld16(blk + 80)), dmin = h2f(ld16(blk + 82));
        u.a0 = d * (float)(sc & 0xfu);
        u.b0 = -(dmin * (float)((sc >> 4) & 0xfu));
        u.a1 = d * (float)((sc >> 8) & 0xfu);
        u.b1 = -(dmin * (float)((sc >> 12) & 0xfu));
    } else if constexpr (QT == Q3_K) {
        const int H = sub >> 2, k = sub & 3;
        u32 hm[8], ql[8], sc[3];
        ldu<8>(blk, hm);
        ldu<8>(blk + 32 + 32 * H, ql);
        ldu<3>(blk + 96, sc);
        const float d = h2f(ld16(blk + 108));
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const u32 q = (ql[i] >> (2 * k)) & 0x03030303u;
            const u32 off = ((~(hm[i] >> sub)) & 0x01010101u) << 2;   // -4 where the hmask bit is 0
            u.w[i] = vsub4(q, off);
        }
        u.a0 = d * scale_q3k(sc[0], sc[1], sc[2], 2 * sub);
        u.a1 = d * scale_q3k(sc[0], sc[1], sc[2], 2 * sub + 1);
    } else if constexpr (QT == Q4_K || QT == Q5_K) {
        const int j = sub >> 1, h = sub & 1;
        const int qs_off = QT == Q4_K ? 16 : 48;
        const uint4 q = *(const uint4*)(blk + qs_off + 32 * j + 16 * h);
        const u32 qv[4] = {q.x, q.y, q.z, q.w};
        u32 hv[4] = {0u, 0u, 0u, 0u};
        if constexpr (QT == Q5_K) {
            const uint4 qh = *(const uint4*)(blk + 16 + 16 * h);
            hv[0] = qh.x; hv[1] = qh.y; hv[2] = qh.z; hv[3] = qh.w;
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            u32 lo = qv[i] & 0x0f0f0f0fu, hi = (qv[i] >> 4) & 0x0f0f0f0fu;
            if constexpr (QT == Q5_K) {
                lo |= ((hv[i] >> (2 * j)) & 0x01010101u) << 4;
                hi |= ((hv[i] >> (2 * j + 1)) & 0x01010101u) << 4;
            }
            u.w[i] = lo;
            u.w[4 + i] = hi;
        }
        const uint4 hd = *(const uint4*)blk;   // d, dmin, 12 bytes of scales (blocks are 16-byte aligned)
        const float d = h2f((u16)(hd.x & 0xffffu)), dmin = h2f((u16)(hd.x >> 16));
        const u32 s0 = hd.y, s1 = hd.z, s2 = hd.w;
        float sc, mn;
        scale_min_k4(s0, s1, s2, 2 * j, sc, mn);
        u.a0 = d * sc;
        u.b0 = -(dmin * mn);
        scale_min_k4(s0, s1, s2, 2 * j + 1, sc, mn);
        u.a1 = d * sc;
        u.b1 = -(dmin * mn);
    } else if constexpr (IS_Q6K<QT>) {
        const int H = sub >> 2, k = sub & 3;
        u32 ql[8], qh[8];
        if constexpr (QT == Q6_KR) {           // 16-byte aligned runs
            ld16b<2>(blk + 64 * H + 32 * (k & 1), ql);
            ld16b<2>(blk + 128 + 32 * H, qh);
        } else {
            ldu<8>(blk + 64 * H + 32 * (k & 1), ql);
            ldu<8>(blk + 128 + 32 * H, qh);
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const u32 q = ((ql[i] >> (4 * (k >> 1))) & 0x0f0f0f0fu) | (((qh[i] >> (2 * k)) & 0x03030303u) << 4);
            u.w[i] = vsub4(q, 0x20202020u);
        }
        const u32 sc = ld16(blk + 192 + 2 * sub);
        const float d = h2f(ld16(dq));
        u.a0 = d * (float)(int)(i8)(sc & 0xffu);
        u.a1 = d * (float)(int)(i8)(sc >> 8);
    } else if constexpr (QT == IQ2_XXS) {
        u32 aux[2];
        ldu<2>(blk + 2 + 8 * sub, aux);
        const float db = h2f(ld16(blk)) * (0.5f + (float)(aux[1] >> 28)) * 0.25f;
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const u32 gi = (aux[0] >> (8 * l)) & 0xffu;
            const u32 s = ksign((aux[1] >> (7 * l)) & 127u);
            u.w[2 * l] = apply_signs(tab[2 * gi], s & 0xfu);
            u.w[2 * l + 1] = apply_signs(tab[2 * gi + 1], s >> 4);
        }
        u.a0 = u.a1 = db;
    } else if constexpr (QT == IQ3_XXS) {
        u32 g[2], aux;
        ldu<2>(blk + 2 + 8 * sub, g);
        ldu<1>(blk + 66 + 4 * sub, &aux);
        const float db = h2f(ld16(blk)) * (0.5f + (float)(aux >> 28)) * 0.5f;
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const u32 gw = g[l >> 1] >> (16 * (l & 1));
            const u32 s = ksign((aux >> (7 * l)) & 127u);
            u.w[2 * l] = apply_signs(tab[gw & 0xffu], s & 0xfu);
            u.w[2 * l + 1] = apply_signs(tab[(gw >> 8) & 0xffu], s >> 4);
        }
        u.a0 = u.a1 = db;
    } else if constexpr (QT == IQ2_XS) {       // 4 uint16: a 9-bit grid index and 7 sign bits each
        u32 q[2];
        ldu<2>(blk + 2 + 8 * sub, q);
        const u32 sc = blk[66 + sub];
        const float d = h2f(ld16(blk));
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const u32 v = (q[l >> 1] >> (16 * (l & 1))) & 0xffffu, gi = v & 511u, s = ksign(v >> 9);
            u.w[2 * l] = apply_signs(tab[2 * gi], s & 0xfu);
            u.w[2 * l + 1] = apply_signs(tab[2 * gi + 1], s >> 4);
        }
        u.a0 = d * (0.5f + (float)(sc & 0xfu)) * 0.25f;
        u.a1 = d * (0.5f + (float)(sc >> 4)) * 0.25f;
    } else if constexpr (QT == IQ2_S) {        // grid index: a byte of qs and 2 bits of qh; signs explicit
        u32 qs, sg;
        ldu<1>(blk + 2 + 4 * sub, &qs);
        ldu<1>(blk + 34 + 4 * sub, &sg);
        const u32 qh = blk[66 + sub], sc = blk[74 + sub];
        const float d = h2f(ld16(blk));
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const u32 gi = ((qs >> (8 * l)) & 0xffu) | ((qh << (8 - 2 * l)) & 0x300u), s = (sg >> (8 * l)) & 0xffu;
            u.w[2 * l] = apply_signs(tab[2 * gi], s & 0xfu);
            u.w[2 * l + 1] = apply_signs(tab[2 * gi + 1], s >> 4);
        }
        u.a0 = d * (0.5f + (float)(sc & 0xfu)) * 0.25f;
        u.a1 = d * (0.5f + (float)(sc >> 4)) * 0.25f;
    } else if constexpr (QT == IQ3_S) {        // grid index: a byte of qs and a bit of qh; signs explicit
        u32 qs[2], sg;
        ldu<2>(blk + 2 + 8 * sub, qs);
        ldu<1>(blk + 74 + 4 * sub, &sg);
        const u32 qh = blk[66 + sub], sc = (blk[106 + sub / 2] >> (4 * (sub & 1))) & 0xfu;
        const float db = h2f(ld16(blk)) * (float)(1 + 2 * sc);
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const u32 b2 = qs[l >> 1] >> (16 * (l & 1)), s = (sg >> (8 * l)) & 0xffu;
            const u32 g1 = (b2 & 0xffu) | ((qh << (8 - 2 * l)) & 256u);
            const u32 g2 = ((b2 >> 8) & 0xffu) | ((qh << (7 - 2 * l)) & 256u);
            u.w[2 * l] = apply_signs(tab[g1], s & 0xfu);
            u.w[2 * l + 1] = apply_signs(tab[g2], s >> 4);
        }
        u.a0 = u.a1 = db;
    } else if constexpr (QT == IQ4_NL) {       // IQ4_XS's values with one fp16 d a block of 32
        u32 q[4];
        ldu<4>(blk + 2, q);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            u.w[i] = lut16(q[i] & 0x0f0f0f0fu, PQ_KVALUES_IQ4NL_0, PQ_KVALUES_IQ4NL_1, PQ_KVALUES_IQ4NL_2,
                           PQ_KVALUES_IQ4NL_3);
            u.w[4 + i] = lut16((q[i] >> 4) & 0x0f0f0f0fu, PQ_KVALUES_IQ4NL_0, PQ_KVALUES_IQ4NL_1,
                               PQ_KVALUES_IQ4NL_2, PQ_KVALUES_IQ4NL_3);
        }
        u.a0 = u.a1 = h2f(ld16(blk));
    } else if constexpr (QT == IQ1_S) {        // 4 grid indices of a byte of qs and 3 bits of qh each
        u32 qs;
        ldu<1>(blk + 2 + 4 * sub, &qs);
        const u32 qh = ld16(blk + 34 + 2 * sub);
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const u32 gi = ((qs >> (8 * l)) & 0xffu) | (((qh >> (3 * l)) & 7u) << 8);
            iq1_entry(tab, gi, qh & 0x8000u, u.w[2 * l], u.w[2 * l + 1]);
        }
        u.a0 = u.a1 = h2f(ld16(blk)) * (float)(2 * ((qh >> 12) & 7u) + 1) * 0.125f;
    } else if constexpr (QT == IQ1_M) {        // d from the top nibbles of the 4 scale words; a delta per 8 values
        u32 qs, sw[2];
        ldu<1>(blk + 4 * sub, &qs);
        ldu<2>(blk + 48, sw);                  // the 4 uint16 scales
        const u32 qh = ld16(blk + 32 + 2 * sub);
        const u32 sc0 = sw[0] & 0xffffu, sc1 = sw[0] >> 16, sc2 = sw[1] & 0xffffu, sc3 = sw[1] >> 16;
        const float d = h2f((u16)((sc0 >> 12) | ((sc1 >> 8) & 0x00f0u) | ((sc2 >> 4) & 0x0f00u) | (sc3 & 0xf000u)));
        const u32 sc = (sub >> 1) == 0 ? sc0 : ((sub >> 1) == 1 ? sc1 : ((sub >> 1) == 2 ? sc2 : sc3));
        const u32 s6 = sc >> (6 * (sub & 1));
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const u32 q8 = (qh >> (8 * (l >> 1))) & 0xffu;           // qh[0] for l 0, 1; qh[1] for 2, 3
            const u32 gi = ((qs >> (8 * l)) & 0xffu) | (((q8 >> (4 * (l & 1))) & 7u) << 8);
            iq1_entry(tab, gi, (q8 >> (4 * (l & 1))) & 8u, u.w[2 * l], u.w[2 * l + 1]);
        }
        u.a0 = d * (float)(2 * (s6 & 7u) + 1) * 0.125f;
        u.a1 = d * (float)(2 * ((s6 >> 3) & 7u) + 1) * 0.125f;
    } else if constexpr (QT == IQ4_XS) {
        const u32 sh = ld16(blk + 2), sl = ld32(blk + 4);
        const u32 ls = ((sl >> (4 * sub)) & 0xfu) | (((sh >> (2 * sub)) & 3u) << 4);
        const float dl = h2f(ld16(blk)) * (float)((int)ls - 32);
        const uint2 qa = *(const uint2*)(blk + 8 + 16 * sub);
        const uint2 qb = *(const uint2*)(blk + 16 + 16 * sub);
        const u32 qv[4] = {qa.x, qa.y, qb.x, qb.y};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            u.w[i] = lut16(qv[i] & 0x0f0f0f0fu, PQ_KVALUES_IQ4NL_0, PQ_KVALUES_IQ4NL_1,
                           PQ_KVALUES_IQ4NL_2, PQ_KVALUES_IQ4NL_3);
            u.w[4 + i] = lut16((qv[i] >> 4) & 0x0f0f0f0fu, PQ_KVALUES_IQ4NL_0, PQ_KVALUES_IQ4NL_1,
                               PQ_KVALUES_IQ4NL_2, PQ_KVALUES_IQ4NL_3);
        }
        u.a0 = u.a1 = dl;
    }
}

// Unit `sub` of block b of a row (its first byte; nblk blocks a row) into u
template <int QT>
PQ_DEV void decode_at(const u8* row, int nblk, int b, int sub, const u32* __restrict__ tab, Unit& u) {
    decode<QT>(block_at<QT>(row, b), block_d<QT>(row, nblk, b), sub, tab, u);
}

// value t (0..15) of segment s as a float (dequantization)
PQ_DEV float unit_value(const Unit& u, int s, int t) {
    const int q = (int)(i8)((u.w[4 * s + (t >> 2)] >> (8 * (t & 3))) & 0xffu);
    return s == 0 ? u.a0 * (float)q + u.b0 : u.a1 * (float)q + u.b1;
}

// silu(g) * u, the same float32 expression as act.cu's silu_mul_f32 (the GEMVs fuse it into
// their activation loads)
PQ_DEV float silu_mul1(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// activation blocks (quantize_q8_x in gemv_gguf.cu): 32 int8 per block and a float4
// (d, d*sum q[0:32], d*sum q[0:16], d*sum q[16:32])
PQ_DEV int dot16(const u32* w, int4 x) {
    int s = dp4a((int)w[0], x.x, 0);
    s = dp4a((int)w[1], x.y, s);
    s = dp4a((int)w[2], x.z, s);
    return dp4a((int)w[3], x.w, s);
}

// A unit's dot with int8 activations: x0 / x1 the 16 values at p0 / p1, d0 / d1 their 32-blocks'
// (d, d*sum32, d*sum of the first 16, d*sum of the last 16)
template <int QT>
PQ_DEV float unit_dot(const Unit& u, int4 x0, int4 x1, float4 d0, float4 d1, int p0, int p1) {
    const float s0 = (float)dot16(u.w, x0), s1 = (float)dot16(u.w + 4, x1);
    float v = u.a0 * d0.x * s0 + u.a1 * d1.x * s1;
    if constexpr (QTraits<QT>::MIN)
        v += u.b0 * ((p0 & 16) ? d0.w : d0.z) + u.b1 * ((p1 & 16) ? d1.w : d1.z);
    return v;
}

}  // namespace pq
