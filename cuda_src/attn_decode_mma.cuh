// Tensor-core decode attention over the paged KV cache (sm_80+, head dims 64 and 128): the same
// contract as attn_decode.cu's kernel (grid (num_splits, num_kv_heads, B), one query row per
// sequence, split s of sequence b's context), but the G = Hq/Hkv query heads of a KV head are the
// rows of an m16n8k16 tile (rows >= G are zero) and the four warps of a block work independently:
// warp w takes keys [k0 + 16w, k0 + 16w + 16) of every 64 keys of the split, straight from global
// memory into mma fragments, with its own online softmax; the warps merge through shared memory
// at the end, with no barrier in the key loop.
//
// No shared-memory staging (but for 8-bit K codes, KRing below): fragments are loaded 16 bytes at a
// time, which a permutation makes possible. QK^T sums over the head dimension in any order, so
// lane (g, t) loads dims [32j + 8t, 32j + 8t + 8) of key g and uses them as the B fragments of
// k-steps 2j and 2j + 1; Q's A fragments follow the same order. For PV the keys are the k
// dimension: lane (g, t) loads dims [64h + 8g, 64h + 8g + 8) of keys 2t, 2t+1, 2t+8, 2t+9 and pairs
// the keys' halves with byte permutes, so n-tile (h, e) holds dims 64h + 8n + e: lane (g, t) ends
// with dims 64h + 16t .. 64h + 16t + 15 of rows g and g + 8.
//
// Splits: with counters != nullptr the last block of a (sequence, KV head) to finish merges the
// splits' partial outputs itself (and resets its counter for the next launch, so CUDA-graph
// replays find zeros); without, attn_decode_combine_f32 does. Q and P are rounded to fp16.
//
// 8-bit caches (int8, E4M3; kv_codes.cuh): each lane loads 8 codes where it loaded 8 fp16 values
// and converts them exactly to fp16. A key's scale multiplies its scores (read from the KRing's
// stage by the lanes holding them); V is multiplied by its rows' scales in fp16 before PV, so
// its values round as an fp16 cache's would. Under RoPE the newest key's warp quantizes its rows.
// With xq, whoever writes the output (the block of a single split, or the merging block) also
// writes its int8 blocks (q8_act.cuh), the input of the output projection's int8 GEMV, so that
// projection needs no quantization launch of its own: of 32 values (xq, xds), or with xb of 256
// (xq chunk-major, xd, xb: the K-quant tensor-core linears' input; group * D % 256 == 0, so that a
// block's output is whole super-blocks).
//
// RoPE (the _rope kernels): q and the new token's k, v come straight from the QKV projection; the
// block rotates its q rows while loading them, and the warp that reads the newest key rotates it
// and stores it with its value into the cache before loading it (the cache pointers carry no
// __restrict__: the same kernel writes and then reads that slot), so no RoPE + KV store launch
// runs between the projection and the attention. The angles are computed before pdl_wait.
//
// PDL: keys before a sequence's newest have been in the cache since earlier steps, so every warp
// whose first step does not hold the newest key issues its first loads before pdl_wait (the kernel
// before this one, RoPE + KV store, writes only the newest); seq_lens, block tables and positions
// are copied in before the graph.
#pragma once

#include "common.cuh"
#include "mma_prims.cuh"
#include "kv_codes.cuh"
#include "q8_act.cuh"
#include "rope_prims.cuh"

#define DM_WARPS 4
#define DM_THREADS (DM_WARPS * 32)
#define DM_KEYS 16              // keys per sub-step: one k-step of PV
#define DM_MIN_CHUNK 64         // fewest keys per split: a step for each warp
#define DM_MAXG 16              // query heads per KV head: the m16 rows
#define DM_MAX_SPLITS 64        // DECODE_MAX_SPLITS in attn_cuda.py
#define DM_MERGE_CHUNK 16       // splits the merging block loads at once

// 8 elements at value col of key `key`'s row for KV head kh (C: kv_codes.cuh), and that row's index
template <typename C, int D>
__device__ __forceinline__ const typename KvCode<C>::Vec8* kv_ptr(const C* cache, const int* __restrict__ table,
                                                                int key, int block_size, int num_kv_heads, int kh,
                                                                int col, i64& row) {
    row = cache_slot(table, key, block_size) * num_kv_heads + kh;
    return kv_vec8<C>(cache, row, D, col);
}

// K fragments of the NS 16-key sub-steps [k0 + 16u, k0 + 16u + 16): rows k0 + 16u + g (n-tile 0)
// and k0 + 16u + 8 + g (n-tile 1), dims 32j + 8t .. + 8; keys past k_last read k_last (their scores
// are masked). 8-bit codes (without a KRing) also their rows' scales into ks (see key_scale).
template <typename C, int D, int NS>
__device__ __forceinline__ void load_k(typename KvCode<C>::Vec8 (&kr)[NS][2][D / 32], float (&ks)[NS][2],
                                       const C* k_cache, const float* k_scales, const int* __restrict__ table, int k0,
                                       int k_last, int block_size, int num_kv_heads, int kh, int g, int t) {
#pragma unroll
    for (int u = 0; u < NS; ++u)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
            i64 row;
            const auto* p = kv_ptr<C, D>(k_cache, table, min(k0 + 16 * u + 8 * nt + g, k_last), block_size,
                                         num_kv_heads, kh, 8 * t, row);
#pragma unroll
            for (int j = 0; j < D / 32; ++j) kr[u][nt][j] = p[4 * j];
            if constexpr (KvCode<C>::QUANT) ks[u][nt] = k_scales[row];
        }
}

// The scale of key 8n + 2t + e of a step (n-tile n = 2u + nt, score column 2t + e of lane (g, t)),
// from the lane that loaded that key's row (g = 2t + e) in load_k. Every lane calls it.
template <int NS>
__device__ __forceinline__ float key_scale(const float (&ks)[NS][2], int n, int t, int e) {
    return __shfl_sync(PC_FULL_MASK, ks[n >> 1][n & 1], 4 * (2 * t + e));
}

// 8-bit K codes through shared memory: each warp copies the K rows (and their scales) of its step
// two steps ahead with cp.async into a ring of two stages, so the loads have a whole step to land
// without holding registers (with K in registers, issued one step ahead, a fifth of the warps'
// time at batch 64 went to waiting for them). Row r's 16-byte chunk c sits at chunk
// c ^ swizzle(r), which keeps both the copies and the fragment reads (lane (g, t): chunk
// 2j + t / 2 of row g) free of bank conflicts. A warp's ring is the same bytes as its o_s rows,
// which it writes after its loop. (V stays in registers: a V ring too, in dynamic shared memory,
// lost at batches 4 and 64.)
template <int D>
struct KRing {
    static constexpr int KEYS = 32;                    // keys a step (a lane each)
    static constexpr int CH = D / 16;                  // 16-byte chunks a row
    static constexpr int BYTES = 2 * KEYS * (D + 4);   // two stages of codes and scales
    static __device__ __forceinline__ int swizzle(int r) {
        return CH == 8 ? (r & 2) | (((r ^ (r >> 2)) & 1) << 2) : r & (CH - 1);
    }
    u8* codes;                                         // [2][KEYS][D]
    float* scales;                                     // [2][KEYS]

    // stage st: the rows of the step's keys (row: this lane's key's row) and their scales
    template <typename C>
    __device__ __forceinline__ void copy(int st, const C* cache, const float* row_scales, int row, int lane) const {
        static_assert(sizeof(C) == 1 && KvCode<C>::PER_ELEM == 1, "a KRing holds 8-bit codes");
        cp_async_zfill<4>(scales + st * KEYS + lane, row_scales + row, true);
        u8* dst = codes + st * KEYS * D;
#pragma unroll
        for (int m = 0; m < CH; ++m) {
            const int i = lane + 32 * m, r = i / CH, c = i % CH;
            const int rr = __shfl_sync(PC_FULL_MASK, row, r);
            cp_async16(dst + r * D + 16 * (c ^ swizzle(r)), reinterpret_cast<const u8*>(cache) + (i64)rr * D + 16 * c);
        }
    }

    // lane (g, t)'s 8 codes of dims 32j + 8t .. + 8 of the step's key r in stage st (load_k's order)
    __device__ __forceinline__ uint2 frag(int st, int r, int j, int t) const {
        const int c = 2 * j + (t >> 1);
        return *reinterpret_cast<const uint2*>(codes + st * KEYS * D + r * D + 16 * (c ^ swizzle(r)) + 8 * (t & 1));
    }
};

// One commit group: the K rows of keys [k0, k0 + 32) into stage st (keys past k_last: k_last's
// rows); k0 >= k_end: an empty group (every step waits for one)
template <typename C, int D>
__device__ __forceinline__ void copy_step(const KRing<D>& kring, int st, const C* k_cache, const float* k_scales,
                                          const int* __restrict__ table, int k0, int k_end, int k_last,
                                          int block_size, int num_kv_heads, int kh, int lane) {
    if (k0 < k_end) {
        const int row = (int)(cache_slot(table, min(k0 + lane, k_last), block_size) * num_kv_heads + kh);
        kring.copy(st, k_cache, k_scales, row, lane);
    }
    cp_async_commit();
}

// V parameters a lane keeps per key: one scale, or int4's (scale, min) for each of its VH groups
template <typename C, int D>
__host__ __device__ constexpr int v_params() { return KvCode<C>::PER_ELEM == 2 ? D / 64 : 1; }

// V of keys k0 + 16u + 2t, 2t + 1, 2t + 8, 2t + 9 (sub-step u), dims 64h + 8g .. + 8 (P = 0 past
// k_last); codes: their parameters in vp (as loaded, see load_k)
template <typename C, int D, int NS>
__device__ __forceinline__ void load_v(typename KvCode<C>::Vec8 (&vr)[NS][4][D / 64],
                                       typename KvCode<C>::Param (&vp)[NS][4][v_params<C, D>()], const C* v_cache,
                                       const float* v_scales, const int* __restrict__ table, int k0, int k_last,
                                       int block_size, int num_kv_heads, int kh, int g, int t) {
#pragma unroll
    for (int u = 0; u < NS; ++u)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            i64 row;
            const auto* p = kv_ptr<C, D>(v_cache, table, min(k0 + 16 * u + 2 * t + (r & 1) + 8 * (r >> 1), k_last),
                                         block_size, num_kv_heads, kh, 8 * g, row);
#pragma unroll
            for (int h = 0; h < D / 64; ++h) vr[u][r][h] = p[8 * h];
            if constexpr (KvCode<C>::QUANT) {
#pragma unroll
                for (int h = 0; h < v_params<C, D>(); ++h) vp[u][r][h] = kv_param<C>(v_scales, row, D, 64 * h + 8 * g);
            }
        }
}

// A key's V parameters in fp16: the scale (times HALF_SCALE), and int4's minimum
struct HalfParam {
    __half2 s, m;
};

template <typename C>
__device__ __forceinline__ HalfParam half_param(typename KvCode<C>::Param p) {
    if constexpr (KvCode<C>::PER_ELEM == 2) {
        return {__float2half2_rn(p.x), __float2half2_rn(p.y)};
    } else {
        return {__float2half2_rn(p * KvCode<C>::HALF_SCALE), __float2half2_rn(0.0f)};
    }
}

// 8 V elements as fp16 values: codes converted and their parameters applied in fp16 (as an fp16
// cache would round them); fp16 as they are
template <typename C>
__device__ __forceinline__ uint4 v_half8(const typename KvCode<C>::Vec8& r, HalfParam p) {
    uint4 h = kv_half8<C>(r);
    if constexpr (KvCode<C>::QUANT) {
        u32* w = reinterpret_cast<u32*>(&h);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const __half2 x = *reinterpret_cast<const __half2*>(&w[i]);
            const __half2 y = KvCode<C>::PER_ELEM == 2 ? __hfma2(x, p.s, p.m) : __hmul2(x, p.s);
            w[i] = *reinterpret_cast<const u32*>(&y);
        }
    }
    return h;
}

// Where the int8 blocks of the output go (all null: nowhere): per 32 (xq, xds) or, with xb, per 256
// (xq, xd, xb; wmax: a float per warp of shared memory)
struct Q8Out {
    signed char* xq;
    float4* xds;
    float* xd;
    short* xb;
    float* wmax;
};

// Output values 4i .. 4i + 3 of a (sequence, KV head)'s group x D block (out + o at value 0), and
// their int8 blocks: the block's values start at float4 r0 of row b of the [B, 4 * n4] int8 rows
// (r0 a multiple of 8 per 32 values, of 64 per 256; i % 64 == threadIdx.x % 64). The whole block
// calls this (the quantizers shuffle, the per-256 one synchronises).
__device__ __forceinline__ void store_out4(float4 v, int i, bool ok, float* __restrict__ out, i64 o,
                                           const Q8Out& q8, int b, int r0, int n4) {
    if (ok) {
        float* p = out + o + 4 * i;
        p[0] = v.x;
        p[1] = v.y;
        p[2] = v.z;
        p[3] = v.w;
    }
    if (q8.xb != nullptr) q8k_store4(v, r0 + i, ok, q8.wmax, q8.xq, q8.xd, q8.xb, b, gridDim.z, n4);
    else if (q8.xq != nullptr) q8_store4(q8_round4(v), (i64)b * n4 + r0 + i, ok, q8.xq, q8.xds);
}

__device__ __forceinline__ float4 f4_fma(float w, float4 a, float4 acc) {
    return make_float4(fmaf(w, a.x, acc.x), fmaf(w, a.y, acc.y), fmaf(w, a.z, acc.z), fmaf(w, a.w, acc.w));
}

__device__ __forceinline__ float4 f4_scale(float4 a, float w) {
    return make_float4(a.x * w, a.y * w, a.z * w, a.w * w);
}

// The RoPE kernels' extra inputs: the new tokens' k and v rows [B, Hkv, D] (token strides given),
// int64 positions and cache slots [B] (a negative slot stores nothing), inv_freq [rot_half].
struct DecodeRope {
    const float* k;
    i64 k_stride;
    const float* v;
    i64 v_stride;
    const i64* positions;
    const i64* slots;
    const float* inv_freq;
    int rot_half;
    bool interleaved;
};

// Values c .. c + 3 of a q row (x, already loaded; `row` is the whole head) rotated as
// rope_store_kv rotates them; halves layout: rot_half % 4 == 0, so the four share a side.
__device__ __forceinline__ float4 rope_q4(float4 x, const float* row, int c, const float (&cs)[2][64],
                                          const DecodeRope& r) {
    float v[4] = {x.x, x.y, x.z, x.w};
    if (r.interleaved) {
#pragma unroll
        for (int p = 0; p < 2; ++p) {
            const int i = c / 2 + p;
            if (i < r.rot_half) rope_rotate(v[2 * p], v[2 * p + 1], cs[0][i], cs[1][i]);
        }
    } else if (c < 2 * r.rot_half) {
        const bool first = c < r.rot_half;
        const int i0 = first ? c : c - r.rot_half;
        const float4 px = *reinterpret_cast<const float4*>(row + (first ? c + r.rot_half : i0));
        const float pv[4] = {px.x, px.y, px.z, px.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float a = first ? v[e] : pv[e], b = first ? pv[e] : v[e];
            rope_rotate(a, b, cs[0][i0 + e], cs[1][i0 + e]);
            v[e] = first ? a : b;
        }
    }
    return make_float4(v[0], v[1], v[2], v[3]);
}

// c += a * b over all 16 rows, or (G8: a group of at most 8 query heads) over rows g only
template <bool G8>
__device__ __forceinline__ void mma_rows(float* c, const u32* a, u32 b0, u32 b1) {
    if constexpr (G8) mma_16816_top(c, a, b0, b1);
    else mma_16816(c, a, b0, b1);
}

template <typename C, typename CV, int D, bool ROPE, bool G8, bool RING>
__device__ __forceinline__ void decode_mma_body(
    const float* __restrict__ q, i64 q_stride, const C* k_cache, const CV* v_cache, const float* k_scales,
    const float* v_scales, const int* __restrict__ block_tables, int bt_stride,
    const int* __restrict__ seq_lens, float* __restrict__ out, i64 out_stride, float* __restrict__ part_o,
    float* __restrict__ part_lse, int* __restrict__ counters, int num_kv_heads, int group, int block_size,
    int num_splits, float scale_log2, signed char* __restrict__ xq, float4* __restrict__ xds,
    float* __restrict__ xd, short* __restrict__ xb,
    const DecodeRope& rope) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int KJ = D / 32;          // 16-byte K loads per key row and lane
    constexpr int KS = D / 16;          // k-steps of QK^T
    constexpr int VH = D / 64;          // 16-byte V loads per key row and lane
    constexpr int OSTR = D + 4;         // o_s row stride (floats)
    // 16-key sub-steps of a warp step: with RING (8-bit codes) two, so that a warp has as many bytes
    // in flight as with fp16 (the loads' latency, not the bandwidth, bounds a step), K through the
    // warp's KRing; without, one, K and its scales in registers, as for fp16 (short splits: a split
    // of 64 keys is one 16-key step for each of the four warps instead of a 32-key step for two)
    static_assert(!RING || KvCode<C>::QUANT, "the KRing holds 8-bit codes");
    constexpr int NS = RING ? 2 : 1;
    constexpr int WKEYS = DM_KEYS * NS;
    constexpr bool KSMEM = RING;
    static_assert(!KSMEM || (WKEYS == KRing<D>::KEYS && KRing<D>::BYTES == DM_MAXG * OSTR * 4),
                  "a warp's K ring is its o_s rows");
    __shared__ __align__(16) float o_s[DM_WARPS][DM_MAXG][OSTR];
    u8* const wbase = reinterpret_cast<u8*>(&o_s[threadIdx.x >> 5][0][0]);
    const KRing<D> kring{wbase, reinterpret_cast<float*>(wbase + 2 * WKEYS * D)};
    __shared__ float m_s[DM_WARPS][DM_MAXG], l_s[DM_WARPS][DM_MAXG];
    __shared__ int last_s;
    __shared__ float wmax_s[DM_WARPS];                 // the per-256 quantizer's warp maxima
    __shared__ float cs[2][64];                        // RoPE: cos, sin of the token's angles

    const int split = blockIdx.x, kh = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int hq_total = num_kv_heads * group, h0 = kh * group;
    const int ctx = seq_lens[b];
    int chunk = (ctx + num_splits - 1) / num_splits;
    chunk = max(DM_MIN_CHUNK, (chunk + DM_KEYS - 1) / DM_KEYS * DM_KEYS);
    const int k_begin = split * chunk, k_end = min(ctx, k_begin + chunk);
    // splits this sequence uses (the rest are empty): when the blocks merge their own splits, the
    // empty ones leave once they have waited (pdl.cuh) and the merge reads only these (a graph's
    // split count is set by the longest context, so at short contexts most splits are empty);
    // attn_decode_combine_f32 reads every split, so without counters the empty ones still write
    // their zero weight
    const int ns = counters != nullptr ? max(1, (ctx + chunk - 1) / chunk) : num_splits;
    if (split >= ns) {
        pdl_wait();
        return;
    }
    const int* table = block_tables + (i64)b * bt_stride;
    const i64 prow0 = (i64)b * hq_total + h0;         // part row of head 0 (times num_splits)
    const i64 out0 = (i64)b * out_stride + (i64)h0 * D;   // value 0 in out
    const Q8Out q8{xq, xds, xd, xb, wmax_s};
    const int r0 = h0 * D / 4, n4_row = hq_total * D / 4;   // the int8 rows: the block's first float4, float4s a row
    const int n4 = group * D / 4;                      // output values of the block / 4

    if (k_begin < k_end || split == 0) {
        const int k_last = k_end - 1;                  // keys past the split load this one (P = 0)
        // the first step's K/V are requested before Q; step i + 1's K once QK^T of step i has used
        // kr, its V once PV has used vr (the K ring: steps i and i + 1 before step i, i + 2 after its QK^T)
        typename KvCode<C>::Vec8 kr[NS][2][KJ];
        float ks[NS][2];                               // 8-bit codes without the ring: the K rows' scales
        typename KvCode<CV>::Vec8 vr[NS][4][VH];
        typename KvCode<CV>::Param vs[NS][4][v_params<CV, D>()];   // and the V rows' parameters (load_v)
        const int k_first = k_begin + WKEYS * warp;
        // the newest key (written by the kernel before, or by this block under RoPE) is read only
        // by the warp whose step holds it (keys past k_last read k_last), so every other warp
        // requests its first step's K/V before pdl_wait
        const int newest = ctx - 1;
        const bool has_newest = k_last == newest;
        const int newest_warp = has_newest ? (newest - k_begin) / WKEYS % DM_WARPS : -1;
        constexpr int WSTEP = WKEYS * DM_WARPS;        // keys from one step of a warp to its next
        const auto first_kv = [&]() {                 // the first step's K / V (and the second's K in the ring)
            if constexpr (KSMEM) {
#pragma unroll
                for (int i = 0; i < 2; ++i)
                    copy_step<C, D>(kring, i, k_cache, k_scales, table, k_first + i * WSTEP, k_end, k_last, block_size,
                                    num_kv_heads, kh, lane);
            } else {
                load_k<C, D, NS>(kr, ks, k_cache, k_scales, table, k_first, k_last, block_size, num_kv_heads, kh, g, t);
            }
            load_v<CV, D, NS>(vr, vs, v_cache, v_scales, table, k_first, k_last, block_size, num_kv_heads, kh, g, t);
        };
        // the ring copies the first two steps ahead
        const bool early = k_first < k_end && !(has_newest && k_first + WKEYS + (KSMEM ? WSTEP : 0) > newest);
        if (early) first_kv();
        if constexpr (ROPE) {
            const float pos = (float)rope.positions[b];
            for (int i = tid; i < rope.rot_half; i += DM_THREADS) sincosf(pos * rope.inv_freq[i], &cs[1][i], &cs[0][i]);
            __syncthreads();
        }
        pdl_wait();
        if constexpr (ROPE) {
            const i64 slot = rope.slots[b];
            if (warp == newest_warp && slot >= 0) {    // the newest key and value into the cache
                const float* __restrict__ kt = rope.k + (i64)b * rope.k_stride + (i64)kh * D;
                const float* __restrict__ vt = rope.v + (i64)b * rope.v_stride + (i64)kh * D;
                const i64 row = slot * num_kv_heads + kh;
                C* kc = const_cast<C*>(k_cache) + row * D;
                CV* vc = const_cast<CV*>(v_cache) + row * D / KvCode<CV>::PER_ELEM;
                constexpr int KP = D / 64, VE = D / 32;   // k pairs and v values per lane
                int ia[KP], ib[KP];
                float ka[KP], kb[KP], vv[VE];
#pragma unroll
                for (int p = 0; p < KP; ++p) {           // every load issued before the first store
                    rope_pair_index(lane + 32 * p, rope.rot_half, rope.interleaved, ia[p], ib[p]);
                    ka[p] = kt[ia[p]];
                    kb[p] = kt[ib[p]];
                }
#pragma unroll
                for (int e = 0; e < VE; ++e) vv[e] = vt[lane + 32 * e];
                float kmax = 0.0f;
#pragma unroll
                for (int p = 0; p < KP; ++p) {
                    const int j = lane + 32 * p;
                    if (j < rope.rot_half) rope_rotate(ka[p], kb[p], cs[0][j], cs[1][j]);
                    kmax = fmaxf(kmax, fmaxf(fabsf(ka[p]), fabsf(kb[p])));
                }
                if constexpr (KvCode<C>::QUANT) {      // the rows quantized as store_kv's kernels do
                    const float kinv = kv_warp_row_scale<C>(kmax, const_cast<float*>(k_scales) + row, lane == 0);
#pragma unroll
                    for (int p = 0; p < KP; ++p) {
                        kc[ia[p]] = KvCode<C>::encode(ka[p] * kinv);
                        kc[ib[p]] = KvCode<C>::encode(kb[p] * kinv);
                    }
                    quant_row<CV>(vv, const_cast<CV*>(v_cache), const_cast<float*>(v_scales), row, D, lane);
                } else {
#pragma unroll
                    for (int p = 0; p < KP; ++p) {
                        kc[ia[p]] = KvType<__half>::store(ka[p]);
                        kc[ib[p]] = KvType<__half>::store(kb[p]);
                    }
#pragma unroll
                    for (int e = 0; e < VE; ++e) vc[lane + 32 * e] = KvType<__half>::store(vv[e]);
                }
            }
            __syncwarp();                              // the warp's stores are visible to its loads
        }
        if (!early && k_first < k_end) {
            first_kv();
        }
        // Q fragments, rows g and g + 8 (zero past the group); dims in the permuted order above
        u32 qf[KS][4];
        {
            const float* qa = q + (i64)b * q_stride + (i64)(h0 + g) * D;
            const float* qb = qa + 8 * D;
            const bool va = g < group, vb = !G8 && g + 8 < group;
#pragma unroll
            for (int ks = 0; ks < KS; ++ks) {
                const int c = 32 * (ks >> 1) + 8 * t + 4 * (ks & 1);
                float4 a = va ? *reinterpret_cast<const float4*>(qa + c) : make_float4(0.f, 0.f, 0.f, 0.f);
                float4 bb = vb ? *reinterpret_cast<const float4*>(qb + c) : make_float4(0.f, 0.f, 0.f, 0.f);
                if constexpr (ROPE) {
                    if (va) a = rope_q4(a, qa, c, cs, rope);
                    if (vb) bb = rope_q4(bb, qb, c, cs, rope);
                }
                qf[ks][0] = pack_f2h2(a.x, a.y);
                qf[ks][1] = pack_f2h2(bb.x, bb.y);
                qf[ks][2] = pack_f2h2(a.z, a.w);
                qf[ks][3] = pack_f2h2(bb.z, bb.w);
            }
        }
        float o[VH][8][4];
#pragma unroll
        for (int h = 0; h < VH; ++h)
#pragma unroll
            for (int e = 0; e < 8; ++e) o[h][e][0] = o[h][e][1] = o[h][e][2] = o[h][e][3] = 0.0f;
        float m_a = pc_neg_inf(), m_b = pc_neg_inf(), l_a = 0.0f, l_b = 0.0f;
        const float k_mul = scale_log2 * KvCode<C>::HALF_SCALE;   // codes: a key's scores times its scale times this
        int st = 0;                                    // KSMEM: the stage holding this step's K
        for (int k0 = k_first; k0 < k_end; k0 += WSTEP) {
            const int k_next = k0 + WSTEP;
            if constexpr (KSMEM) {                     // this step's copies have landed (the next step's may not)
                cp_async_wait<1>();
                __syncwarp();
            }
            float s[2 * NS][4];                        // n-tile n: keys k0 + 8n ..
#pragma unroll
            for (int u = 0; u < NS; ++u)
#pragma unroll
                for (int nt = 0; nt < 2; ++nt) {
                    float* sn = s[2 * u + nt];
                    sn[0] = sn[1] = sn[2] = sn[3] = 0.0f;
#pragma unroll
                    for (int j = 0; j < KJ; ++j) {
                        typename KvCode<C>::Vec8 kf;
                        if constexpr (KSMEM) kf = kring.frag(st, 16 * u + 8 * nt + g, j, t);
                        else kf = kr[u][nt][j];
                        const uint4 kh8 = kv_half8<C>(kf);
                        mma_rows<G8>(sn, qf[2 * j], kh8.x, kh8.y);
                        mma_rows<G8>(sn, qf[2 * j + 1], kh8.z, kh8.w);
                    }
                }
            // score (., 8n + 2t + e) times its key's scale: the stage's scale 8n + 2t + e, or key_scale's (fp16: none)
            float sc[2 * NS][2];
#pragma unroll
            for (int n = 0; n < 2 * NS; ++n)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    if constexpr (KSMEM) sc[n][e] = kring.scales[st * WKEYS + 8 * n + 2 * t + e] * k_mul;
                    else if constexpr (KvCode<C>::QUANT) sc[n][e] = key_scale<NS>(ks, n, t, e) * k_mul;
                    else sc[n][e] = scale_log2;
                }
            if constexpr (KSMEM) {                     // the stage is read: the step after next into it
                __syncwarp();
                copy_step<C, D>(kring, st, k_cache, k_scales, table, k_next + WSTEP, k_end, k_last, block_size,
                                num_kv_heads, kh, lane);
                st ^= 1;
            } else if (k_next < k_end) {
                load_k<C, D, NS>(kr, ks, k_cache, k_scales, table, k_next, k_last, block_size, num_kv_heads, kh, g, t);
            }
            float mx_a = pc_neg_inf(), mx_b = pc_neg_inf();
#pragma unroll
            for (int n = 0; n < 2 * NS; ++n)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const bool ok = k0 + 8 * n + 2 * t + e < k_end;
                    s[n][e] = ok ? s[n][e] * sc[n][e] : pc_neg_inf();
                    mx_a = fmaxf(mx_a, s[n][e]);
                    if constexpr (!G8) {
                        s[n][2 + e] = ok ? s[n][2 + e] * sc[n][e] : pc_neg_inf();
                        mx_b = fmaxf(mx_b, s[n][2 + e]);
                    }
                }
            float al_a, al_b;
            softmax_step<2 * NS, !G8>(s, mx_a, mx_b, m_a, m_b, l_a, l_b, al_a, al_b);
#pragma unroll
            for (int h = 0; h < VH; ++h)
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    o[h][e][0] *= al_a;
                    o[h][e][1] *= al_a;
                    if constexpr (!G8) {
                        o[h][e][2] *= al_b;
                        o[h][e][3] *= al_b;
                    }
                }
#pragma unroll
            for (int u = 0; u < NS; ++u) {
                const u32 pa[4] = {pack_f2h2(s[2 * u][0], s[2 * u][1]), pack_f2h2(s[2 * u][2], s[2 * u][3]),
                                   pack_f2h2(s[2 * u + 1][0], s[2 * u + 1][1]),
                                   pack_f2h2(s[2 * u + 1][2], s[2 * u + 1][3])};
                constexpr int VP = v_params<CV, D>();
                HalfParam vph[4][VP];                  // codes: the keys' V parameters in fp16
#pragma unroll
                for (int r = 0; r < 4; ++r)
#pragma unroll
                    for (int i = 0; i < VP; ++i) vph[r][i] = half_param<CV>(vs[u][r][i]);
#pragma unroll
                for (int h = 0; h < VH; ++h) {
                    const int i = h % VP;
                    const uint4 v0 = v_half8<CV>(vr[u][0][h], vph[0][i]), v1 = v_half8<CV>(vr[u][1][h], vph[1][i]);
                    const uint4 v2 = v_half8<CV>(vr[u][2][h], vph[2][i]), v3 = v_half8<CV>(vr[u][3][h], vph[3][i]);
                    const u32 w0[4] = {v0.x, v0.y, v0.z, v0.w};
                    const u32 w1[4] = {v1.x, v1.y, v1.z, v1.w};
                    const u32 w2[4] = {v2.x, v2.y, v2.z, v2.w};
                    const u32 w3[4] = {v3.x, v3.y, v3.z, v3.w};
#pragma unroll
                    for (int i = 0; i < 4; ++i)
#pragma unroll
                        for (int hi = 0; hi < 2; ++hi) {
                            const u32 sel = hi ? 0x7632u : 0x5410u;   // low or high halves of both keys
                            mma_rows<G8>(o[h][2 * i + hi], pa, __byte_perm(w0[i], w1[i], sel),
                                         __byte_perm(w2[i], w3[i], sel));
                        }
                }
            }
            if (k_next < k_end)
                load_v<CV, D, NS>(vr, vs, v_cache, v_scales, table, k_next, k_last, block_size, num_kv_heads, kh, g, t);
        }
        l_a = quad_sum(l_a);
        if constexpr (!G8) l_b = quad_sum(l_b);
        if constexpr (KSMEM) {                         // the ring becomes this warp's o_s rows
            cp_async_wait<0>();
            __syncwarp();
        }
        // this warp's state to shared memory (a warp without keys has m = -inf, l = 0, o = 0)
#pragma unroll
        for (int rr = 0; rr < (G8 ? 1 : 2); ++rr) {
            const int row = g + 8 * rr;
            if (row < group) {
#pragma unroll
                for (int h = 0; h < VH; ++h)
#pragma unroll
                    for (int e = 0; e < 8; ++e) {
                        o_s[warp][row][64 * h + 16 * t + e] = o[h][e][2 * rr];
                        o_s[warp][row][64 * h + 16 * t + 8 + e] = o[h][e][2 * rr + 1];
                    }
                if (t == 0) {
                    m_s[warp][row] = rr ? m_b : m_a;
                    l_s[warp][row] = rr ? l_b : l_a;
                }
            }
        }
        __syncthreads();
        for (int i0 = 0; i0 < n4; i0 += DM_THREADS) {  // four values a thread; whole warps iterate
            const int i = i0 + tid;
            const bool ok = i < n4;
            const int row = ok ? 4 * i / D : 0, d = 4 * i % D;
            float mx = pc_neg_inf();
#pragma unroll
            for (int w = 0; w < DM_WARPS; ++w) mx = fmaxf(mx, m_s[w][row]);
            float4 num = make_float4(0.f, 0.f, 0.f, 0.f);
            float den = 0.0f;
#pragma unroll
            for (int w = 0; w < DM_WARPS; ++w) {
                const float wt = m_s[w][row] == pc_neg_inf() ? 0.0f : exp2f(m_s[w][row] - mx);
                num = f4_fma(wt, *reinterpret_cast<const float4*>(&o_s[w][row][d]), num);
                den += wt * l_s[w][row];
            }
            const float4 v = f4_scale(num, den > 0.0f ? 1.0f / den : 0.0f);
            if (ns == 1) {
                store_out4(v, i, ok, out, out0, q8, b, r0, n4_row);
            } else if (ok) {
                const i64 pr = (prow0 + row) * num_splits + split;
                *reinterpret_cast<float4*>(part_o + pr * D + d) = v;
                if (d == 0) part_lse[pr] = den > 0.0f ? mx + log2f(den) : pc_neg_inf();
            }
        }
    } else {                                           // empty split: only its weight (zero)
        pdl_wait();
        if (tid < group) part_lse[(prow0 + tid) * num_splits + split] = pc_neg_inf();
    }
    if (ns == 1 || counters == nullptr) return;

    // the last block of this (sequence, KV head) to get here merges the splits. One thread counts
    // with an acquire-release atomic after the barrier (the barrier orders the block's partials
    // before it, the release publishes them; the acquire makes the others' visible to the merging
    // block after the next barrier): no fence by every thread.
    __syncthreads();
    if (tid == 0) {
        int* cnt = counters + (i64)b * num_kv_heads + kh;
        last_s = atomic_add_acq_rel_gpu(cnt, 1) == ns - 1;
        if (last_s) *cnt = 0;                          // every block has counted: ready for the next launch
    }
    __syncthreads();
    if (!last_s) return;
    for (int i0 = 0; i0 < n4; i0 += DM_THREADS) {
        const int i = i0 + tid;
        const bool ok = i < n4;
        const int row = ok ? 4 * i / D : 0, d = 4 * i % D;
        const float* po = part_o + (prow0 + row) * num_splits * D + d;
        const float* pl = part_lse + (prow0 + row) * num_splits;
        float4 num = make_float4(0.f, 0.f, 0.f, 0.f);
        float mx = pc_neg_inf(), den = 0.0f;
        // DM_MERGE_CHUNK splits at a time, their log-sum-exps loaded with their partial outputs (one
        // round trip); the chunks merge online (split 0, in the first, is never empty)
        for (int s0 = 0; s0 < ns; s0 += DM_MERGE_CHUNK) {
            float lse[DM_MERGE_CHUNK];
            float4 v[DM_MERGE_CHUNK];
#pragma unroll
            for (int j = 0; j < DM_MERGE_CHUNK; ++j) {
                const bool in = s0 + j < ns;
                lse[j] = in ? __ldcg(pl + s0 + j) : pc_neg_inf();
                v[j] = in ? __ldcg(reinterpret_cast<const float4*>(po + (i64)(s0 + j) * D)) : num;
            }
            float m = mx;
#pragma unroll
            for (int j = 0; j < DM_MERGE_CHUNK; ++j) m = fmaxf(m, lse[j]);
            const float a = mx == pc_neg_inf() ? 0.0f : exp2f(mx - m);
            num = f4_scale(num, a);
            den *= a;
#pragma unroll
            for (int j = 0; j < DM_MERGE_CHUNK; ++j) {   // a split with no keys weighs 0
                const float wt = lse[j] == pc_neg_inf() ? 0.0f : exp2f(lse[j] - m);
                if (wt != 0.0f) num = f4_fma(wt, v[j], num);
                den += wt;
            }
            mx = m;
        }
        store_out4(f4_scale(num, 1.0f / den), i, ok, out, out0, q8, b, r0, n4_row);   // split 0 is never empty
    }
#else
    __trap();
#endif
}

// RESTRICT: __restrict__ on the caches where the kernel only reads them (their loads may take the
// read-only path), empty where it writes them too. C, CV: the K and V cache elements (kv_codes.cuh);
// the scales are unused (null) for fp16.
#define DECODE_MMA_PARAMS(C, CV, RESTRICT)                                                            \
    const float* __restrict__ q, i64 q_stride, const C* RESTRICT k_cache, const CV* RESTRICT v_cache, \
        const float* RESTRICT k_scales, const float* RESTRICT v_scales,                              \
        const int* __restrict__ block_tables, int bt_stride, const int* __restrict__ seq_lens,        \
        float* __restrict__ out, i64 out_stride, float* __restrict__ part_o, float* __restrict__ part_lse, \
        int* __restrict__ counters, int num_kv_heads, int group, int block_size, int num_splits,      \
        float scale_log2, signed char* __restrict__ xq, float4* __restrict__ xds, float* __restrict__ xd, \
        short* __restrict__ xb
#define DECODE_MMA_ARGS                                                                               \
    q, q_stride, k_cache, v_cache, k_scales, v_scales, block_tables, bt_stride, seq_lens, out, out_stride, \
        part_o, part_lse, counters, num_kv_heads, group, block_size, num_splits, scale_log2, xq, xds, xd, xb

// attn_decode_mma_<KV>_hd<D>: q rotated, the cache holding the new tokens. attn_decode_mma_rope_<KV>_hd<D>:
// q straight from the projection, RoPE and the KV store done here (DecodeRope's fields follow xb).
// Names ending in _g8: for groups of at most 8 query heads (rows g + 8 of the tiles unused: fewer
// registers and instructions). 8-bit codes: K through the KRing (32-key steps), or with _k16 before
// _g8 in registers (16-key steps; DECODE_MMA_KERNEL_KV8).
#define DECODE_MMA_KERNEL_G(KV, C, CV, D, SUFFIX, G8, RING)                                           \
    extern "C" __global__ void __launch_bounds__(DM_THREADS) attn_decode_mma_##KV##_hd##D##SUFFIX(    \
        DECODE_MMA_PARAMS(C, CV, __restrict__)) {                                                     \
        decode_mma_body<C, CV, D, false, G8, RING>(DECODE_MMA_ARGS, DecodeRope{}); /* calls pdl_wait() */ \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(DM_THREADS) attn_decode_mma_rope_##KV##_hd##D##SUFFIX( \
        DECODE_MMA_PARAMS(C, CV, ), const float* __restrict__ k_new, i64 k_stride,                    \
        const float* __restrict__ v_new, i64 v_stride, const i64* __restrict__ positions,             \
        const i64* __restrict__ slots, const float* __restrict__ inv_freq, int rot_half, int interleaved) { \
        decode_mma_body<C, CV, D, true, G8, RING>(DECODE_MMA_ARGS, DecodeRope{k_new, k_stride, v_new, v_stride, \
                                                                              positions, slots, inv_freq, rot_half, \
                                                                              interleaved != 0});       \
    }
#define DECODE_MMA_KERNEL(KV, C, CV, D)                                                               \
    DECODE_MMA_KERNEL_G(KV, C, CV, D, , false, KvCode<C>::QUANT)                                      \
    DECODE_MMA_KERNEL_G(KV, C, CV, D, _g8, true, KvCode<C>::QUANT)
// 8-bit codes: the KRing kernels and the _k16 ones (K in registers, 16-key steps)
#define DECODE_MMA_KERNEL_KV8(KV, C, CV, D)                                                           \
    DECODE_MMA_KERNEL(KV, C, CV, D)                                                                   \
    DECODE_MMA_KERNEL_G(KV, C, CV, D, _k16, false, false)                                             \
    DECODE_MMA_KERNEL_G(KV, C, CV, D, _k16_g8, true, false)
