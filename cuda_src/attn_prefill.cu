// Causal prefill attention over the paged KV cache (flash-attention style, online softmax).
// q [N, Hq, D] float32 (token stride q_stride); sequence b owns rows query_start[b]..[b+1]; its
// row i sits at position seq_lens[b] - nq + i and attends keys 0..that position (a cached prefix
// plus the new chunk). K/V come from the fp16 cache, which already holds the new tokens.
//
// Query tiles of BQ rows never straddle sequences. Sequence b's tiles are numbered from
// query_start[b] / BQ + b, so grid.x = N / BQ + B covers every tile of every sequence without
// reading the lengths on the host (blocks past a sequence's last tile return at once).
// grid = (N / BQ + B, Hq), block 128.
#include "common.cuh"

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

__device__ __forceinline__ i64 cache_slot(const int* __restrict__ table, int key, int block_size) {
    return (i64)table[key / block_size] * block_size + key % block_size;
}

// ---------------------------------------------------------------------------------------------
// Plain kernel (any arch): BQ = 16 rows (4 per warp), BK = 32 keys (lane = key for the scores).
#define PF_BQ 16
#define PF_BK 32

template <typename T, int D>
__device__ __forceinline__ void prefill_plain_body(
    const float* __restrict__ q, i64 q_stride, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
    const int* __restrict__ query_start, const int* __restrict__ seq_lens, const int* __restrict__ block_tables,
    int bt_stride, int num_seqs, float* __restrict__ out, i64 out_stride, int num_kv_heads, int group,
    int block_size, float scale_log2) {
    constexpr int KSTR = D + 2;                       // odd word stride: lane-per-key reads conflict-free
    constexpr int EPL = D >= 32 ? D / 32 : 1;         // output columns per lane: d = lane + 32 * e
    constexpr int RPW = PF_BQ / 4;                    // rows per warp
    __shared__ float q_s[PF_BQ][D];
    __shared__ T k_s[PF_BK][KSTR];
    __shared__ T v_s[PF_BK][D];

    int b, q0, nq, r0;
    if (!find_tile(query_start, num_seqs, PF_BQ, blockIdx.x, b, q0, nq, r0)) return;
    const int h = blockIdx.y, kh = h / group;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int ctx = seq_lens[b];
    const int rows = min(PF_BQ, nq - r0);
    const int kmax = ctx - nq + r0 + rows - 1;        // last key any row of the tile needs
    const int* table = block_tables + (i64)b * bt_stride;

    for (int i = tid; i < PF_BQ * D; i += blockDim.x) {
        const int r = i / D, d = i % D;
        q_s[r][d] = r < rows ? q[(i64)(q0 + r0 + r) * q_stride + (i64)h * D + d] * scale_log2 : 0.0f;
    }
    float m[RPW], l[RPW], acc[RPW][EPL];
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
        m[i] = pc_neg_inf();
        l[i] = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; ++e) acc[i][e] = 0.0f;
    }

    for (int k0 = 0; k0 <= kmax; k0 += PF_BK) {
        __syncthreads();
        for (int i = tid; i < PF_BK * D; i += blockDim.x) {
            const int j = i / D, d = i % D, key = k0 + j;
            T kv = KvType<T>::store(0.0f), vv = kv;
            if (key < ctx) {
                const i64 off = (cache_slot(table, key, block_size) * num_kv_heads + kh) * D + d;
                kv = k_cache[off];
                vv = v_cache[off];
            }
            k_s[j][d] = kv;
            v_s[j][d] = vv;
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
            for (int d = 0; d < D; ++d) s += q_s[r][d] * KvType<T>::load(k_s[lane][d]);
            if (key > qpos || key >= ctx) s = pc_neg_inf();
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
        const float inv = 1.0f / l[i];
#pragma unroll
        for (int e = 0; e < EPL; ++e) {
            const int d = lane + 32 * e;
            if (d < D) out[(i64)(q0 + r0 + r) * out_stride + (i64)h * D + d] = acc[i][e] * inv;
        }
    }
}

#define PREFILL_PLAIN_KERNEL(NAME, T, D)                                                            \
    extern "C" __global__ void __launch_bounds__(128) NAME(                                         \
        const float* __restrict__ q, i64 q_stride, const T* __restrict__ k_cache,                   \
        const T* __restrict__ v_cache, const int* __restrict__ query_start,                         \
        const int* __restrict__ seq_lens, const int* __restrict__ block_tables, int bt_stride,       \
        int num_seqs, float* __restrict__ out, i64 out_stride, int num_kv_heads, int group,         \
        int block_size, float scale_log2) {                                                         \
        prefill_plain_body<T, D>(q, q_stride, k_cache, v_cache, query_start, seq_lens, block_tables, \
                                 bt_stride, num_seqs, out, out_stride, num_kv_heads, group,         \
                                 block_size, scale_log2);                                           \
    }

PREFILL_PLAIN_KERNEL(attn_prefill_plain_f16_hd16, __half, 16)
PREFILL_PLAIN_KERNEL(attn_prefill_plain_f16_hd32, __half, 32)
PREFILL_PLAIN_KERNEL(attn_prefill_plain_f16_hd64, __half, 64)
PREFILL_PLAIN_KERNEL(attn_prefill_plain_f16_hd128, __half, 128)

#include "attn_prefill_mma.cuh"
