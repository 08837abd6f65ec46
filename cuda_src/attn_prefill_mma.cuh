// Tensor-core prefill (sm_80+; tiles of 64 query rows, block 128), included by attn_prefill.cuh: mma.sync m16n8k16, fp16 inputs,
// fp32 accumulators, FlashAttention-2 register layout. BQ = 64 query rows (16 per warp); K/V
// tiles of BK keys (64 for D <= 64, else 32) double-buffered in shared memory by cp.async, B
// fragments read with ldmatrix (.trans for V). Q is rounded to fp16 (K/V already are); P is
// rounded to fp16 for the PV product. 8-bit caches: each tile's codes are loaded into registers
// while the previous tile is used, then stored to its stage as fp16 values (CodeTile). On older
// archs the kernel traps: the launcher only picks it for sm_80+. The *_split_* kernels take one
// key split per block (see attn_prefill.cuh).
#pragma once

#include "mma_prims.cuh"

#define MMA_BQ 64

// cp.async of keys [k0, k0 + BK) of one KV head (fp16) into a stage; keys >= ctx are zero-filled
// (0 * garbage could be NaN in the PV product).
template <int D, int BK, int STR>
__device__ __forceinline__ void mma_load_tile(__half* k_dst, __half* v_dst, const __half* __restrict__ k_cache,
                                              const __half* __restrict__ v_cache, const int* __restrict__ table,
                                              int k0, int ctx, int block_size, int num_kv_heads, int kh) {
    constexpr int CH = D / 8;
    for (int i = threadIdx.x; i < BK * CH; i += blockDim.x) {
        const int j = i / CH, c = i % CH, key = k0 + j;
        __half* kd = k_dst + j * STR + c * 8;
        __half* vd = v_dst + j * STR + c * 8;
        if (key < ctx) {
            const i64 off = (cache_slot(table, key, block_size) * num_kv_heads + kh) * D + c * 8;
            cp_async16(kd, k_cache + off);
            cp_async16(vd, v_cache + off);
        } else {
            *reinterpret_cast<uint4*>(kd) = make_uint4(0, 0, 0, 0);
            *reinterpret_cast<uint4*>(vd) = make_uint4(0, 0, 0, 0);
        }
    }
    cp_async_commit();
}

// The codes of a key tile (C, CV: K and V elements), held in registers from their loads (issued
// before the previous tile's math) until they fill their stage as fp16 values (after it): a
// thread's CPT chunks of 8 values, i = threadIdx.x + 128c (blockDim.x 128), and their parameters,
// as loaded (anything computed from them at the load would wait for it there); keys at or past ctx
// are stored as zeros.
template <typename C, typename CV, int D, int BK>
struct CodeTile {
    static constexpr int CH = D / 8, CPT = BK * CH / 128;
    typename KvCode<C>::Vec8 k[CPT];
    typename KvCode<CV>::Vec8 v[CPT];
    typename KvCode<C>::Param ks[CPT];
    typename KvCode<CV>::Param vs[CPT];
    int k0, ctx;

    __device__ __forceinline__ void load(const C* __restrict__ k_cache, const CV* __restrict__ v_cache,
                                         const float* __restrict__ k_scales, const float* __restrict__ v_scales,
                                         const int* __restrict__ table, int k0, int ctx, int block_size,
                                         int num_kv_heads, int kh) {
        this->k0 = k0;
        this->ctx = ctx;
#pragma unroll
        for (int c = 0; c < CPT; ++c) {
            const int i = threadIdx.x + 128 * c;
            const i64 row = cache_slot(table, min(k0 + i / CH, ctx - 1), block_size) * num_kv_heads + kh;
            k[c] = *kv_vec8<C>(k_cache, row, D, i % CH * 8);
            v[c] = *kv_vec8<CV>(v_cache, row, D, i % CH * 8);
            ks[c] = kv_param<C>(k_scales, row, D, i % CH * 8);
            vs[c] = kv_param<CV>(v_scales, row, D, i % CH * 8);
        }
    }

    template <int STR>
    __device__ __forceinline__ void store(__half* k_dst, __half* v_dst) const {
#pragma unroll
        for (int c = 0; c < CPT; ++c) {
            const int i = threadIdx.x + 128 * c, o = i / CH * STR + i % CH * 8;
            const bool ok = k0 + i / CH < ctx;
            *reinterpret_cast<uint4*>(k_dst + o) = ok ? kv_scaled8<C>(k[c], ks[c]) : make_uint4(0, 0, 0, 0);
            *reinterpret_cast<uint4*>(v_dst + o) = ok ? kv_scaled8<CV>(v[c], vs[c]) : make_uint4(0, 0, 0, 0);
        }
    }
};

// SPLIT: block z takes split z of the tile's keys and writes partials (see attn_prefill.cuh).
template <typename C, typename CV, int D, bool SPLIT>
__device__ __forceinline__ void prefill_mma_body(
    const float* __restrict__ q, i64 q_stride, const C* __restrict__ k_cache, const CV* __restrict__ v_cache,
    const float* __restrict__ k_scales, const float* __restrict__ v_scales, const int* __restrict__ query_start, const int* __restrict__ seq_lens,
    const int* __restrict__ block_tables, int bt_stride, int num_seqs, float* __restrict__ out, i64 out_stride,
    int num_kv_heads, int group, int block_size, float scale_log2, float* __restrict__ part_o,
    float* __restrict__ part_lse) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int BK = D <= 64 ? 64 : 32;   // keys per tile: two stages of K and V fit 48 KB
    constexpr int STR = D + 8;        // smem row stride (halves): ldmatrix rows are conflict-free
    constexpr int KS = D / 16;        // k-steps over the head dim (QK^T)
    constexpr int DN = D / 8;         // n-tiles over the head dim (PV)
    constexpr int NT = BK / 8;        // n-tiles over the keys (QK^T)
    __shared__ __align__(16) __half k_s[2][BK * STR];
    __shared__ __align__(16) __half v_s[2][BK * STR];

    int b, q0, nq, r0;
    if (!find_tile(query_start, num_seqs, MMA_BQ, blockIdx.x, b, q0, nq, r0)) return;
    const int h = blockIdx.y, kh = h / group;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int ctx = seq_lens[b];
    const int rows = min(MMA_BQ, nq - r0);
    const int kmax = ctx - nq + r0 + rows - 1;
    const int warp_kmax = min(kmax, ctx - nq + r0 + warp * 16 + 15);
    const int* table = block_tables + (i64)b * bt_stride;
    const int ra = warp * 16 + g, rb = ra + 8;
    const int qpos_a = ctx - nq + r0 + ra, qpos_b = qpos_a + 8;
    const int split = SPLIT ? blockIdx.z : 0;
    int k_begin, k_end, key_lim;                      // keys [k_begin, k_end); those >= key_lim masked
    if (!block_key_range<SPLIT>(kmax, ctx, part_lse, q0 + r0, rows, h, k_begin, k_end, key_lim)) return;

    u32 qf[KS][4];
    {
        const float* qa = q + (i64)(q0 + r0 + ra) * q_stride + (i64)h * D + 2 * t;
        const float* qb = q + (i64)(q0 + r0 + rb) * q_stride + (i64)h * D + 2 * t;
        const bool va = ra < rows, vb = rb < rows;
        const float2 z = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            const float2 a0 = va ? *reinterpret_cast<const float2*>(qa + ks * 16) : z;
            const float2 a1 = va ? *reinterpret_cast<const float2*>(qa + ks * 16 + 8) : z;
            const float2 b0 = vb ? *reinterpret_cast<const float2*>(qb + ks * 16) : z;
            const float2 b1 = vb ? *reinterpret_cast<const float2*>(qb + ks * 16 + 8) : z;
            qf[ks][0] = pack_f2h2(a0.x, a0.y);
            qf[ks][1] = pack_f2h2(b0.x, b0.y);
            qf[ks][2] = pack_f2h2(a1.x, a1.y);
            qf[ks][3] = pack_f2h2(b1.x, b1.y);
        }
    }
    float o[DN][4];
#pragma unroll
    for (int dn = 0; dn < DN; ++dn) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.0f;
    float m_a = pc_neg_inf(), m_b = pc_neg_inf(), l_a = 0.0f, l_b = 0.0f;

    const int ntiles = SPLIT ? (k_end - k_begin + BK - 1) / BK : kmax / BK + 1;
    constexpr bool QUANT = KvCode<C>::QUANT;
    CodeTile<C, CV, D, BK> codes;                     // quantized caches: the next tile's codes
    if constexpr (QUANT) {
        codes.load(k_cache, v_cache, k_scales, v_scales, table, k_begin, key_lim, block_size, num_kv_heads, kh);
        codes.template store<STR>(k_s[0], v_s[0]);
    } else {
        mma_load_tile<D, BK, STR>(k_s[0], v_s[0], k_cache, v_cache, table, k_begin, key_lim, block_size, num_kv_heads,
                                  kh);
    }
    // ldmatrix row addresses of this lane: matrix mi = lane / 8, row lane % 8
    const int mi = lane >> 3, mr = lane & 7;
    const int k_row = (mi >> 1) * 8 + mr, k_col = (mi & 1) * 8;      // K: (n-tile pair, d half)
    const int v_row = (mi & 1) * 8 + mr, v_col = (mi >> 1) * 8;      // V: (key half, d-tile pair)

    for (int it = 0; it < ntiles; ++it) {
        const int k0 = k_begin + it * BK, st = it & 1;
        if constexpr (QUANT) {
            if (it + 1 < ntiles)
                codes.load(k_cache, v_cache, k_scales, v_scales, table, k0 + BK, key_lim, block_size, num_kv_heads, kh);
        } else if (it + 1 < ntiles) {
            mma_load_tile<D, BK, STR>(k_s[st ^ 1], v_s[st ^ 1], k_cache, v_cache, table, k0 + BK, key_lim, block_size,
                                      num_kv_heads, kh);
        } else {
            cp_async_commit();
        }
        cp_async_wait<1>();
        __syncthreads();
        if (k0 <= warp_kmax) {            // else none of this warp's rows reach these keys
            const __half* ks_ = k_s[st];
            const __half* vs_ = v_s[st];
            float s[NT][4];
#pragma unroll
            for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
#pragma unroll
                for (int ks = 0; ks < KS; ++ks) {
                    u32 kb[4];                // b0, b1 of n-tile j, then of n-tile j + 1
                    ldsm_x4(kb, ks_ + (j * 8 + k_row) * STR + ks * 16 + k_col);
                    mma_16816(s[j], qf[ks], kb[0], kb[1]);
                    mma_16816(s[j + 1], qf[ks], kb[2], kb[3]);
                }
            }
            float mx_a = pc_neg_inf(), mx_b = pc_neg_inf();
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int key = k0 + j * 8 + 2 * t + e;
                    const float sa = (key > qpos_a || key >= key_lim) ? pc_neg_inf() : s[j][e] * scale_log2;
                    const float sb = (key > qpos_b || key >= key_lim) ? pc_neg_inf() : s[j][2 + e] * scale_log2;
                    s[j][e] = sa;
                    s[j][2 + e] = sb;
                    mx_a = fmaxf(mx_a, sa);
                    mx_b = fmaxf(mx_b, sb);
                }
            float al_a, al_b;
            softmax_step<NT>(s, mx_a, mx_b, m_a, m_b, l_a, l_b, al_a, al_b);
#pragma unroll
            for (int dn = 0; dn < DN; ++dn) {
                o[dn][0] *= al_a;
                o[dn][1] *= al_a;
                o[dn][2] *= al_b;
                o[dn][3] *= al_b;
            }
#pragma unroll
            for (int kk = 0; kk < BK / 16; ++kk) {
                const u32 pa[4] = {pack_f2h2(s[2 * kk][0], s[2 * kk][1]), pack_f2h2(s[2 * kk][2], s[2 * kk][3]),
                                   pack_f2h2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                   pack_f2h2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
                for (int dn = 0; dn < DN; dn += 2) {
                    u32 vb[4];                // b0, b1 of d-tile dn, then of d-tile dn + 1
                    ldsm_x4_trans(vb, vs_ + (kk * 16 + v_row) * STR + dn * 8 + v_col);
                    mma_16816(o[dn], pa, vb[0], vb[1]);
                    mma_16816(o[dn + 1], pa, vb[2], vb[3]);
                }
            }
        }                                 // k0 <= warp_kmax
        if constexpr (QUANT) {            // stage st ^ 1 was read in tile it - 1, before the barrier below it
            if (it + 1 < ntiles) codes.template store<STR>(k_s[st ^ 1], v_s[st ^ 1]);
        }
        __syncthreads();                  // stage st is free for tile it + 2
    }
    cp_async_wait<0>();
    l_a = quad_sum(l_a);
    l_b = quad_sum(l_b);
    // split partials: l == 0 when no key of the split reaches the row (o is 0 then)
    const float inv_a = SPLIT && l_a == 0.0f ? 0.0f : 1.0f / l_a;
    const float inv_b = SPLIT && l_b == 0.0f ? 0.0f : 1.0f / l_b;
    float* oa = out + (i64)(q0 + r0 + ra) * out_stride + (i64)h * D + 2 * t;
    float* ob = out + (i64)(q0 + r0 + rb) * out_stride + (i64)h * D + 2 * t;
    if (SPLIT) {
        const i64 pa = split_row(q0 + r0 + ra, h, split), pb = split_row(q0 + r0 + rb, h, split);
        oa = part_o + pa * D + 2 * t;
        ob = part_o + pb * D + 2 * t;
        if (t == 0 && ra < rows) part_lse[pa] = l_a > 0.0f ? m_a + log2f(l_a) : pc_neg_inf();
        if (t == 0 && rb < rows) part_lse[pb] = l_b > 0.0f ? m_b + log2f(l_b) : pc_neg_inf();
    }
#pragma unroll
    for (int dn = 0; dn < DN; ++dn) {
        if (ra < rows) *reinterpret_cast<float2*>(oa + dn * 8) = make_float2(o[dn][0] * inv_a, o[dn][1] * inv_a);
        if (rb < rows) *reinterpret_cast<float2*>(ob + dn * 8) = make_float2(o[dn][2] * inv_b, o[dn][3] * inv_b);
    }
#else
    __trap();
#endif
}

