// Multi-head latent attention (DeepSeek-V2/V3, absorbed form) over paged K pages of one KV head
// whose row for a token is its latent [rope(k_pe), c_kv] (D = r + R values); the same rows serve as
// values, from column r on. NumPy reference: NumpyOps.mla_attention's paged_attention call
// (pocketcupy/backend/ops_ref.py). Pages: fp16, or int8 / fp8 codes with one scale a row (kv_codes.cuh).
//
// attn_mla_<tag>: q [N, H, D] float32 (contiguous; W_UK already multiplied in, rope applied);
// sequence b owns rows query_start[b]..[b+1], row i of it at position seq_lens[b] - nq + i
// attending keys 0..that position. grid (N, ceil(H / MLA_HEADS), S), block MLA_THREADS: a block
// takes one query row and MLA_HEADS heads (MLA_HPW a warp, scores as warp sums over the lanes'
// columns), takes MLA_TILE keys at a time into shared memory as float32 (the next tile's loads in
// registers meanwhile) and keeps an online softmax per head. S = 1 writes out [N, H, R]; S > 1
// splits the keys, each split writing its normalised partial output and log2-sum-exp to part_o
// [N, H, S, R] / part_lse [N, H, S] (-inf where empty),
// merged by attn_decode_combine_f32 (attn_decode.cu). Rows past query_start[B] (padding) and rows
// without keys write zeros.
//
// mla_store_<tag>: the latent rows x [N, D] float32 (row stride x_stride) into the pages at
// slot_mapping [N] int64 (negative: skipped); a warp a row, quantized with one scale a row as the
// NumPy reference does. grid ceil(N / 4), block 128.
#include "common.cuh"
#include "kv_codes.cuh"

#define MLA_THREADS 256
#define MLA_WARPS (MLA_THREADS / 32)
#define MLA_HPW 2                           // heads a warp
#define MLA_HEADS (MLA_WARPS * MLA_HPW)     // heads a block
#define MLA_TILE 16                         // keys a shared tile
#define MLA_MAX_DIM 576                     // D = kv_lora_rank + qk_rope_head_dim (DeepSeek-V3: 512 + 64)
#define MLA_E (MLA_MAX_DIM / 32)            // columns a lane
#define MLA_SPLIT_ALIGN MLA_TILE

#define MLA_LOADS ((MLA_TILE * MLA_MAX_DIM / 8 + MLA_THREADS - 1) / MLA_THREADS)   // 8-value loads a thread a tile

// A thread's share of one key tile, loaded into registers while the tile before is used, then
// written to the shared tile as float32 (scales applied; zeros past the tile's nt keys).
template <typename C>
struct TileLoads {
    typename KvCode<C>::Vec8 raw[MLA_LOADS];
    typename KvCode<C>::Param prm[MLA_LOADS];

    __device__ __forceinline__ void issue(const C* __restrict__ cache, const float* __restrict__ scales,
                                          const int* __restrict__ table, int block_size, int D, int t0, int nt) {
        const int chunks = D / 8;
#pragma unroll
        for (int u = 0; u < MLA_LOADS; ++u) {
            const int i = threadIdx.x + u * MLA_THREADS, j = i / chunks, c = (i % chunks) * 8;
            if (j < nt) {
                const i64 slot = cache_slot(table, t0 + j, block_size);
                raw[u] = *kv_vec8<C>(cache, slot, D, c);
                if constexpr (KvCode<C>::QUANT) prm[u] = kv_param<C>(scales, slot, D, c);
            }
        }
    }

    __device__ __forceinline__ void store(float (*ks)[MLA_MAX_DIM], int D, int nt) const {
        const int chunks = D / 8;
#pragma unroll
        for (int u = 0; u < MLA_LOADS; ++u) {
            const int i = threadIdx.x + u * MLA_THREADS, j = i / chunks, c = (i % chunks) * 8;
            if (j >= MLA_TILE) break;
            float f[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            if (j < nt) {
                uint4 h8;
                if constexpr (KvCode<C>::QUANT) h8 = kv_scaled8<C>(raw[u], prm[u]);
                else h8 = raw[u];
                KvType<__half>::unpack16(h8, f);
            }
            *reinterpret_cast<float4*>(&ks[j][c]) = make_float4(f[0], f[1], f[2], f[3]);
            *reinterpret_cast<float4*>(&ks[j][c + 4]) = make_float4(f[4], f[5], f[6], f[7]);
        }
    }
};

template <typename C>
__device__ __forceinline__ void mla_body(const float* __restrict__ q, const C* __restrict__ cache,
                                         const float* __restrict__ scales, const int* __restrict__ query_start,
                                         const int* __restrict__ seq_lens, const int* __restrict__ block_tables,
                                         int bt_stride, int num_seqs, int H, int D, int r, int block_size,
                                         float scale_log2, float* __restrict__ out, float* __restrict__ part_o,
                                         float* __restrict__ part_lse) {
    __shared__ __align__(16) float ks[MLA_TILE][MLA_MAX_DIM];
    const int n = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int split = blockIdx.z, num_splits = gridDim.z, R = D - r;
    const int h0 = blockIdx.y * MLA_HEADS + warp * MLA_HPW;

    int k_begin = 0, k_end = 0, b = 0;
    if (n < query_start[num_seqs]) {
        int lo = 0, hi = num_seqs - 1;              // the last sequence starting at or before row n
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (query_start[mid] <= n) lo = mid; else hi = mid - 1;
        }
        b = lo;
        const int q0 = query_start[b], nq = query_start[b + 1] - q0;
        const int kend = max(0, seq_lens[b] - nq + (n - q0) + 1);
        int chunk = (kend + num_splits - 1) / num_splits;
        chunk = (chunk + MLA_SPLIT_ALIGN - 1) / MLA_SPLIT_ALIGN * MLA_SPLIT_ALIGN;
        k_begin = min(split * chunk, kend);
        k_end = min(kend, k_begin + chunk);
    }
    const int* table = block_tables + (i64)b * bt_stride;

    float qv[MLA_HPW][MLA_E], acc[MLA_HPW][MLA_E], m[MLA_HPW], l[MLA_HPW];
#pragma unroll
    for (int j = 0; j < MLA_HPW; ++j) {
        const int h = h0 + j;
#pragma unroll
        for (int e = 0; e < MLA_E; ++e) {
            const int c = lane + 32 * e;
            qv[j][e] = h < H && c < D ? q[((i64)n * H + h) * D + c] * scale_log2 : 0.0f;
            acc[j][e] = 0.0f;
        }
        m[j] = pc_neg_inf();
        l[j] = 0.0f;
    }

    TileLoads<C> loads;
    if (k_begin < k_end) loads.issue(cache, scales, table, block_size, D, k_begin, min(MLA_TILE, k_end - k_begin));
    for (int t0 = k_begin; t0 < k_end; t0 += MLA_TILE) {
        const int nt = min(MLA_TILE, k_end - t0);
        __syncthreads();                             // the previous tile is used
        loads.store(ks, D, nt);
        __syncthreads();
        if (t0 + MLA_TILE < k_end)                   // the next tile's loads in flight while this one is used
            loads.issue(cache, scales, table, block_size, D, t0 + MLA_TILE, min(MLA_TILE, k_end - t0 - MLA_TILE));

        float s[MLA_HPW][MLA_TILE];
#pragma unroll
        for (int t = 0; t < MLA_TILE; ++t) {
            float a[MLA_HPW];
#pragma unroll
            for (int j = 0; j < MLA_HPW; ++j) a[j] = 0.0f;
#pragma unroll
            for (int e = 0; e < MLA_E; ++e) {
                const int c = lane + 32 * e;
                const float k = c < D ? ks[t][c] : 0.0f;
#pragma unroll
                for (int j = 0; j < MLA_HPW; ++j) a[j] = fmaf(qv[j][e], k, a[j]);
            }
#pragma unroll
            for (int j = 0; j < MLA_HPW; ++j) s[j][t] = t < nt ? warp_sum(a[j]) : pc_neg_inf();
        }
#pragma unroll
        for (int j = 0; j < MLA_HPW; ++j) {
            float mt = pc_neg_inf();
#pragma unroll
            for (int t = 0; t < MLA_TILE; ++t) mt = fmaxf(mt, s[j][t]);
            const float mn = fmaxf(m[j], mt);        // finite: the tile has a key
            const float alpha = exp2f(m[j] - mn);
            l[j] *= alpha;
#pragma unroll
            for (int e = 0; e < MLA_E; ++e) acc[j][e] *= alpha;
#pragma unroll
            for (int t = 0; t < MLA_TILE; ++t) {
                const float p = exp2f(s[j][t] - mn);    // 0 past nt
                l[j] += p;
#pragma unroll
                for (int e = 0; e < MLA_E; ++e) {
                    const int c = r + lane + 32 * e;
                    if (c < D) acc[j][e] = fmaf(p, ks[t][c], acc[j][e]);
                }
            }
            m[j] = mn;
        }
    }

#pragma unroll
    for (int j = 0; j < MLA_HPW; ++j) {
        const int h = h0 + j;
        if (h >= H) continue;
        const float inv = l[j] > 0.0f ? 1.0f / l[j] : 0.0f;
        float* dst;
        if (num_splits == 1) {
            dst = out + ((i64)n * H + h) * R;
        } else {
            const i64 row = ((i64)n * H + h) * num_splits + split;
            dst = part_o + row * R;
            if (lane == 0) part_lse[row] = l[j] > 0.0f ? m[j] + log2f(l[j]) : pc_neg_inf();
        }
#pragma unroll
        for (int e = 0; e < MLA_E; ++e) {
            const int c = lane + 32 * e;
            if (c < R) dst[c] = acc[j][e] * inv;
        }
    }
}

#define ATTN_MLA_KERNEL(TAG, C)                                                                        \
    extern "C" __global__ void __launch_bounds__(MLA_THREADS) attn_mla_##TAG(                          \
        const float* __restrict__ q, const C* __restrict__ cache, const float* __restrict__ scales,    \
        const int* __restrict__ query_start, const int* __restrict__ seq_lens,                          \
        const int* __restrict__ block_tables, int bt_stride, int num_seqs, int H, int D, int r,         \
        int block_size, float scale_log2, float* __restrict__ out, float* __restrict__ part_o,          \
        float* __restrict__ part_lse) {                                                                 \
        pdl_wait();                                                                                     \
        mla_body<C>(q, cache, scales, query_start, seq_lens, block_tables, bt_stride, num_seqs, H, D, r, \
                    block_size, scale_log2, out, part_o, part_lse);                                     \
    }

ATTN_MLA_KERNEL(f16, __half)
ATTN_MLA_KERNEL(i8, signed char)
ATTN_MLA_KERNEL(e4m3, u8)

template <typename C>
__device__ __forceinline__ void mla_store_body(const float* __restrict__ x, i64 x_stride,
                                               const i64* __restrict__ slot_mapping, C* __restrict__ cache,
                                               float* __restrict__ scales, int n, int D) {
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n) return;
    const i64 slot = slot_mapping[row];
    if (slot < 0) return;
    float v[MLA_E];
#pragma unroll
    for (int e = 0; e < MLA_E; ++e) {
        const int c = lane + 32 * e;
        v[e] = c < D ? x[row * x_stride + c] : 0.0f;
    }
    if constexpr (KvCode<C>::QUANT) {
        quant_row<C, MLA_E>(v, cache, scales, slot, D, lane);
    } else {
#pragma unroll
        for (int e = 0; e < MLA_E; ++e) {
            const int c = lane + 32 * e;
            if (c < D) cache[slot * D + c] = __float2half_rn(v[e]);
        }
    }
}

#define MLA_STORE_KERNEL(TAG, C)                                                                       \
    extern "C" __global__ void mla_store_##TAG(const float* __restrict__ x, i64 x_stride,              \
                                               const i64* __restrict__ slot_mapping, C* __restrict__ cache, \
                                               float* __restrict__ scales, int n, int D) {              \
        pdl_wait();                                                                                     \
        mla_store_body<C>(x, x_stride, slot_mapping, cache, scales, n, D);                              \
    }

MLA_STORE_KERNEL(f16, __half)
MLA_STORE_KERNEL(i8, signed char)
MLA_STORE_KERNEL(e4m3, u8)
