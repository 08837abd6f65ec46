// Causal prefill attention over the paged KV cache (flash-attention style, online softmax).
// q [N, Hq, D] float32 (token stride q_stride); sequence b owns rows query_start[b]..[b+1]; its
// row i sits at position seq_lens[b] - nq + i and attends keys 0..that position (a cached prefix
// plus the new chunk). K/V come from the cache, which already holds the new tokens: fp16, or 8-bit
// codes with a scale per row (kv_codes.cuh; the _i8 / _e4m3 kernels), turned into fp16 values as
// the key tiles are loaded into shared memory.
//
// Query tiles of BQ rows never straddle sequences. Sequence b's tiles are numbered from
// query_start[b] / BQ + b, so grid.x = N / BQ + B covers every tile of every sequence without
// reading the lengths on the host (blocks past a sequence's last tile return at once).
// grid = (N / BQ + B, Hq), block 128.
//
// Split-KV kernels (*_split_*, for a short chunk over a long prefix: too few tiles to fill the
// GPU): grid = (N / BQ + B, Hq, S). Block z takes split z of the keys its tile needs, [0, kmax];
// it writes each row's normalised partial output and log2-sum-exp (-inf for a row none of whose
// keys lie in the split) to part_o [N, Hq, S, D] / part_lse [N, Hq, S], and
// attn_decode_combine_f32 (attn_decode.cu) merges them. Split 0 holds key 0, so every row has at
// least one non-empty split; an empty split writes only lse = -inf.
#pragma once

#include "common.cuh"
#include "kv_codes.cuh"

// Finds the sequence and the first row of query tile `t` (tiles of bq rows); false if none.
__device__ __forceinline__ bool find_tile(const int* __restrict__ query_start, int num_seqs, int bq, int t,
                                          int& b, int& q0, int& nq, int& r0) {
    int lo = 0, hi = num_seqs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (query_start[mid] / bq + mid <= t) lo = mid; else hi = mid - 1;
    }
    b = lo;
    q0 = query_start[b];
    nq = query_start[b + 1] - q0;
    r0 = (t - (q0 / bq + b)) * bq;
    return r0 < nq;
}

// Keys [k_begin, k_end) of split `split` (of num_splits) of a tile that needs keys [0, kend):
// chunks of ceil(kend / num_splits) keys rounded up to PF_SPLIT_ALIGN (a multiple of every key
// tile), so short tiles use fewer splits and the trailing ones are empty (k_begin >= k_end).
#define PF_SPLIT_ALIGN 64
__device__ __forceinline__ void split_keys(int kend, int num_splits, int split, int& k_begin, int& k_end) {
    int chunk = (kend + num_splits - 1) / num_splits;
    chunk = (chunk + PF_SPLIT_ALIGN - 1) / PF_SPLIT_ALIGN * PF_SPLIT_ALIGN;
    k_begin = min(split * chunk, kend);
    k_end = min(kend, k_begin + chunk);
}

// Index of (query row, head, split) in part_lse; times D (plus the column) in part_o.
__device__ __forceinline__ i64 split_row(i64 row, int h, int split) {
    return (row * gridDim.y + h) * gridDim.z + split;
}

// An empty split: lse = -inf for every row of the tile (the combine then skips its part_o).
__device__ __forceinline__ void write_empty_split(float* __restrict__ part_lse, i64 row0, int rows, int h,
                                                  int split) {
    for (int r = threadIdx.x; r < rows; r += blockDim.x) part_lse[split_row(row0 + r, h, split)] = pc_neg_inf();
}

// The keys a block attends to, for a tile whose rows need keys [0, kmax]: [k_begin, k_end), keys
// at or past key_lim masked (k_end <= ctx). A split block takes split blockIdx.z of them; when that
// split is empty it writes lse = -inf for the tile's rows and returns false (the block exits).
template <bool SPLIT>
__device__ __forceinline__ bool block_key_range(int kmax, int ctx, float* __restrict__ part_lse, i64 row0,
                                                int rows, int h, int& k_begin, int& k_end, int& key_lim) {
    k_begin = 0;
    k_end = kmax + 1;
    key_lim = ctx;
    if (SPLIT) {
        split_keys(kmax + 1, gridDim.z, blockIdx.z, k_begin, k_end);
        key_lim = k_end;
        if (k_begin >= k_end) {
            write_empty_split(part_lse, row0, rows, h, blockIdx.z);
            return false;
        }
    }
    return true;
}

// ---------------------------------------------------------------------------------------------
// Plain kernel (any arch): BQ = 16 rows (4 per warp), BK = 32 keys (lane = key for the scores).
// Past head dim 128 the query tile is kept in fp16 (as the mma kernel rounds it) so the three tiles
// fit the 48 KB of static shared memory: 16 x 256 floats would take 16 KB of it.
#define PF_BQ 16
#define PF_BK 32

template <bool HALF> struct PrefillQTile { typedef float T; };
template <> struct PrefillQTile<true> { typedef __half T; };
__device__ __forceinline__ float q_tile_value(float x) { return x; }
__device__ __forceinline__ float q_tile_value(__half x) { return __half2float(x); }
__device__ __forceinline__ void q_tile_store(float& dst, float x) { dst = x; }
__device__ __forceinline__ void q_tile_store(__half& dst, float x) { dst = __float2half_rn(x); }

template <typename C, typename CV, int D, bool SPLIT>
__device__ __forceinline__ void prefill_plain_body(
    const float* __restrict__ q, i64 q_stride, const C* __restrict__ k_cache, const CV* __restrict__ v_cache,
    const float* __restrict__ k_scales, const float* __restrict__ v_scales, const int* __restrict__ query_start, const int* __restrict__ seq_lens, const int* __restrict__ block_tables,
    int bt_stride, int num_seqs, float* __restrict__ out, i64 out_stride, int num_kv_heads, int group,
    int block_size, float scale_log2, float* __restrict__ part_o, float* __restrict__ part_lse) {
    constexpr int KSTR = D + 2;                       // odd word stride: lane-per-key reads conflict-free
    constexpr int EPL = D >= 32 ? D / 32 : 1;         // output columns per lane: d = lane + 32 * e
    constexpr int RPW = PF_BQ / 4;                    // rows per warp
    typedef __half T;                                 // the shared-memory tiles' values
    __shared__ typename PrefillQTile<(D > 128)>::T q_s[PF_BQ][D];
    __shared__ __align__(16) T k_s[PF_BK][KSTR];
    __shared__ __align__(16) T v_s[PF_BK][D];

    int b, q0, nq, r0;
    if (!find_tile(query_start, num_seqs, PF_BQ, blockIdx.x, b, q0, nq, r0)) return;
    const int h = blockIdx.y, kh = h / group;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int ctx = seq_lens[b];
    const int rows = min(PF_BQ, nq - r0);
    const int kmax = ctx - nq + r0 + rows - 1;        // last key any row of the tile needs
    const int* table = block_tables + (i64)b * bt_stride;
    const int split = SPLIT ? blockIdx.z : 0;
    int k_begin, k_end, key_lim;                      // keys [k_begin, k_end); those >= key_lim masked
    if (!block_key_range<SPLIT>(kmax, ctx, part_lse, q0 + r0, rows, h, k_begin, k_end, key_lim)) return;

    for (int i = tid; i < PF_BQ * D; i += blockDim.x) {
        const int r = i / D, d = i % D;
        q_tile_store(q_s[r][d], r < rows ? q[(i64)(q0 + r0 + r) * q_stride + (i64)h * D + d] * scale_log2 : 0.0f);
    }
    float m[RPW], l[RPW], acc[RPW][EPL];
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
        m[i] = pc_neg_inf();
        l[i] = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; ++e) acc[i][e] = 0.0f;
    }

    for (int k0 = k_begin; k0 < k_end; k0 += PF_BK) {
        __syncthreads();
        for (int i = tid; i < PF_BK * D / 8; i += blockDim.x) {     // 8 values at a time
            const int j = i / (D / 8), d = i % (D / 8) * 8, key = k0 + j;
            uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
            if (key < key_lim) {
                const i64 row = cache_slot(table, key, block_size) * num_kv_heads + kh;
                kv = kv_load8_scaled<C>(k_cache, k_scales, row, D, d);
                vv = kv_load8_scaled<CV>(v_cache, v_scales, row, D, d);
            }
            u32* kd = reinterpret_cast<u32*>(&k_s[j][d]);      // KSTR is even: 4-byte aligned
            kd[0] = kv.x;
            kd[1] = kv.y;
            kd[2] = kv.z;
            kd[3] = kv.w;
            *reinterpret_cast<uint4*>(&v_s[j][d]) = vv;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < RPW; ++i) {
            const int r = warp * RPW + i;
            if (r >= rows) break;
            const int qpos = ctx - nq + r0 + r;
            if (k0 > qpos) continue;                          // later rows may still need it
            const int key = k0 + lane;
            float s = 0.0f;
#pragma unroll 8
            for (int d = 0; d < D; ++d) s += q_tile_value(q_s[r][d]) * KvType<T>::load(k_s[lane][d]);
            if (key > qpos || key >= key_lim) s = pc_neg_inf();
            const float m_new = fmaxf(m[i], warp_max(s));      // finite: key k0 <= qpos is valid
            const float p = exp2f(s - m_new);
            const float alpha = exp2f(m[i] - m_new);
            l[i] = l[i] * alpha + warp_sum(p);
            m[i] = m_new;
#pragma unroll
            for (int e = 0; e < EPL; ++e) acc[i][e] *= alpha;
            for (int j = 0; j < PF_BK; ++j) {
                const float pj = __shfl_sync(PC_FULL_MASK, p, j);
#pragma unroll
                for (int e = 0; e < EPL; ++e) {
                    const int d = lane + 32 * e;
                    if (d < D) acc[i][e] += pj * KvType<T>::load(v_s[j][d]);
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
        const int r = warp * RPW + i;
        if (r >= rows) break;
        const i64 row = q0 + r0 + r;
        if (!SPLIT) {
            const float inv = 1.0f / l[i];
#pragma unroll
            for (int e = 0; e < EPL; ++e) {
                const int d = lane + 32 * e;
                if (d < D) out[row * out_stride + (i64)h * D + d] = acc[i][e] * inv;
            }
        } else {                                      // l == 0: no key of this split reaches the row
            const i64 pr = split_row(row, h, split);
            const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
#pragma unroll
            for (int e = 0; e < EPL; ++e) {
                const int d = lane + 32 * e;
                if (d < D) part_o[pr * D + d] = acc[i][e] * inv;
            }
            if (lane == 0) part_lse[pr] = l[i] > 0.0f ? m[i] + log2f(l[i]) : pc_neg_inf();
        }
    }
}

// The kernels' parameters, shared by the plain and the mma variants (C, CV: the K and V cache
// elements; the scales are unused, null, for fp16).
#define PREFILL_PARAMS(C, CV)                                                                        \
    const float* __restrict__ q, i64 q_stride, const C* __restrict__ k_cache, const CV* __restrict__ v_cache, \
        const float* __restrict__ k_scales, const float* __restrict__ v_scales, const int* __restrict__ query_start, const int* __restrict__ seq_lens,                     \
        const int* __restrict__ block_tables, int bt_stride, int num_seqs, float* __restrict__ out, \
        i64 out_stride, int num_kv_heads, int group, int block_size, float scale_log2
#define PREFILL_ARGS                                                                                 \
    q, q_stride, k_cache, v_cache, k_scales, v_scales, query_start, seq_lens, block_tables, bt_stride, num_seqs, out, out_stride, \
        num_kv_heads, group, block_size, scale_log2

// attn_prefill_<V>_<KV>_hd<D>: grid = (tiles + B, Hq); attn_prefill_<V>_split_<KV>_hd<D>: grid =
// (tiles + B, Hq, S), partial outputs for the combine (out unused). BODY_FULL / BODY_SPLIT: the
// variant's body instantiated with SPLIT false / true. KV: f16, i8, e4m3, k8v4 (elements C, CV).
#define PREFILL_KERNEL_PAIR(V, KV, D, C, CV, BODY_FULL, BODY_SPLIT)                                  \
    extern "C" __global__ void __launch_bounds__(128) attn_prefill_##V##_##KV##_hd##D(PREFILL_PARAMS(C, CV)) { \
        pdl_wait();                                                                                     \
        BODY_FULL(PREFILL_ARGS, nullptr, nullptr);                                                   \
    }                                                                                                \
    extern "C" __global__ void __launch_bounds__(128) attn_prefill_##V##_split_##KV##_hd##D(       \
        PREFILL_PARAMS(C, CV), float* __restrict__ part_o, float* __restrict__ part_lse) {         \
        pdl_wait();                                                                                \
        BODY_SPLIT(PREFILL_ARGS, part_o, part_lse);                                                  \
    }

// Both variants' kernels for one cache type at head dim D (attn_prefill.cu: fp16;
// attn_prefill_kv8.cu: the codes, a module of their own that fp16 caches never compile)
// The plain kernels alone (head dims past the mma kernel's shared memory: 256).
#define PREFILL_PLAIN_KERNELS(KV, C, CV, D)                                                           \
    PREFILL_KERNEL_PAIR(plain, KV, D, C, CV, (prefill_plain_body<C, CV, D, false>),                    \
                        (prefill_plain_body<C, CV, D, true>))

#define PREFILL_KERNELS(KV, C, CV, D)                                                                 \
    PREFILL_KERNEL_PAIR(plain, KV, D, C, CV, (prefill_plain_body<C, CV, D, false>),                    \
                        (prefill_plain_body<C, CV, D, true>))                                         \
    PREFILL_KERNEL_PAIR(mma, KV, D, C, CV, (prefill_mma_body<C, CV, D, false>), (prefill_mma_body<C, CV, D, true>))

#include "attn_prefill_mma.cuh"
