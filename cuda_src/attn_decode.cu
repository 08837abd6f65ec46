// Decode attention over the paged KV cache (flash-decoding). One query row per sequence:
// row b of q is sequence b. Grid (num_splits, num_kv_heads, B); a block handles all G = Hq/Hkv
// query heads of one KV head over one contiguous split of the context, so K/V are read once per
// KV head. num_splits is fixed by the launcher (not by the sequence lengths) so the grid is the
// same on every CUDA-graph replay; each sequence cuts its own context into num_splits chunks.
// With num_splits == 1 the block writes the final output; otherwise it writes a normalised
// partial output plus its log2-sum-exp, and attn_decode_combine_f32 merges the splits (an empty
// split writes only lse = -inf). Split 0 is never empty for a non-empty context.
#include "common.cuh"

#define DEC_THREADS 128
#define DEC_WARPS (DEC_THREADS / 32)
#define DEC_TILE 32          // keys per pipeline stage (lane = key in the score phase)
#define DEC_MIN_CHUNK 32     // fewest keys per split (one tile)
#define DEC_MAXG 16          // most query heads per KV head

// Issues the cp.async copies of keys [t0, min(t0 + DEC_TILE, k_end)) into one stage; commits them.
template <typename T, int D, int STR>
__device__ __forceinline__ void decode_load_tile(T* k_dst, T* v_dst, const T* __restrict__ k_cache,
                                                 const T* __restrict__ v_cache, const int* __restrict__ table,
                                                 int t0, int k_end, int block_size, int num_kv_heads, int kh) {
    constexpr int EPC = KvType<T>::PER16, CH = D / EPC;
    const int n = min(DEC_TILE, k_end - t0);
    for (int i = threadIdx.x; i < DEC_TILE * CH; i += DEC_THREADS) {
        const int j = i / CH, c = i % CH;
        if (j < n) {
            const int p = t0 + j;
            const i64 off = (((i64)table[p / block_size] * block_size + p % block_size) * num_kv_heads + kh) * D + c * EPC;
            cp_async16(k_dst + j * STR + c * EPC, k_cache + off);
            cp_async16(v_dst + j * STR + c * EPC, v_cache + off);
        }
    }
    cp_async_commit();
}

// K/V tiles go global -> shared with 16-byte cp.async, double-buffered: tile i+1 is in flight
// while tile i is used. Scores: lane = key, warp w takes heads w, w + 4, ...; PV: a thread owns
// two adjacent columns for heads hg, hg + HG, ... Rows padded by 16 bytes (conflict-free).
template <typename T, int D>
__device__ __forceinline__ void decode_body(
    const float* __restrict__ q, i64 q_stride, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
    const int* __restrict__ block_tables, int bt_stride, const int* __restrict__ seq_lens,
    float* __restrict__ out, i64 out_stride, float* __restrict__ part_o, float* __restrict__ part_lse,
    int num_kv_heads, int group, int block_size, int num_splits, float scale_log2) {
    constexpr int STR = D + KvType<T>::PER16;        // smem row stride (elements): +16 bytes
    constexpr int EPC = KvType<T>::PER16;            // elements per 16-byte chunk
    constexpr int CH = D / EPC;                      // chunks per row
    constexpr int NP = D / 2;                        // column pairs
    constexpr int HG = DEC_THREADS / NP;             // head groups in the PV phase
    constexpr int HPT = (DEC_MAXG + HG - 1) / HG;    // heads per thread in the PV phase
    constexpr int SPW = DEC_MAXG / DEC_WARPS;        // heads per warp in the score phase

    __shared__ __align__(16) T k_s[2][DEC_TILE * STR];
    __shared__ __align__(16) T v_s[2][DEC_TILE * STR];
    __shared__ __align__(16) float q_s[DEC_MAXG][D];
    __shared__ float s_s[DEC_TILE][DEC_MAXG + 1];
    __shared__ float m_s[DEC_MAXG], l_s[DEC_MAXG], alpha_s[DEC_MAXG];

    const int split = blockIdx.x, kh = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int hq_total = num_kv_heads * group, h0 = kh * group;
    const int ctx = seq_lens[b];
    int chunk = (ctx + num_splits - 1) / num_splits;
    chunk = max(DEC_MIN_CHUNK, (chunk + 15) & ~15);  // short contexts use fewer, fuller splits
    const int k_begin = split * chunk;
    const int k_end = min(ctx, k_begin + chunk);
    if (k_begin >= k_end && split > 0) {               // empty split: only its weight (zero) is written
        if (tid < group) part_lse[((i64)b * hq_total + h0 + tid) * num_splits + split] = pc_neg_inf();
        return;
    }
    const int* table = block_tables + (i64)b * bt_stride;
    const int ntiles = (k_end - k_begin + DEC_TILE - 1) / DEC_TILE;

    if (ntiles > 0)
        decode_load_tile<T, D, STR>(k_s[0], v_s[0], k_cache, v_cache, table, k_begin, k_end, block_size, num_kv_heads, kh);

    for (int i = tid; i < group * D; i += DEC_THREADS)
        q_s[i / D][i % D] = q[(i64)b * q_stride + (i64)h0 * D + i] * scale_log2;
    if (tid < DEC_MAXG) { m_s[tid] = pc_neg_inf(); l_s[tid] = 0.0f; alpha_s[tid] = 1.0f; }

    const int hg = tid / NP, cp = tid % NP;
    float acc[HPT][2];
#pragma unroll
    for (int i = 0; i < HPT; ++i) acc[i][0] = acc[i][1] = 0.0f;

    for (int it = 0; it < ntiles; ++it) {
        const int t0 = k_begin + it * DEC_TILE, n = min(DEC_TILE, k_end - t0), st = it & 1;
        if (it + 1 < ntiles)
            decode_load_tile<T, D, STR>(k_s[st ^ 1], v_s[st ^ 1], k_cache, v_cache, table, t0 + DEC_TILE, k_end,
                                        block_size, num_kv_heads, kh);
        else
            cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();                               // tile `it` landed for every thread; q_s ready
        // scores
        {
            const T* krow = &k_s[st][lane * STR];
            float s[SPW];
#pragma unroll
            for (int i = 0; i < SPW; ++i) s[i] = 0.0f;
#pragma unroll 4
            for (int c = 0; c < CH; ++c) {
                float kv[EPC];
                KvType<T>::unpack16(*reinterpret_cast<const uint4*>(krow + c * EPC), kv);
#pragma unroll
                for (int i = 0; i < SPW; ++i) {
                    const int h = warp + i * DEC_WARPS;
                    if (h < group) {
                        const float4* qv = reinterpret_cast<const float4*>(&q_s[h][c * EPC]);
#pragma unroll
                        for (int e4 = 0; e4 < EPC / 4; ++e4) {
                            const float4 qq = qv[e4];
                            s[i] += qq.x * kv[4 * e4] + qq.y * kv[4 * e4 + 1] + qq.z * kv[4 * e4 + 2] + qq.w * kv[4 * e4 + 3];
                        }
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < SPW; ++i) {
                const int h = warp + i * DEC_WARPS;
                if (h < group && lane < n) s_s[lane][h] = s[i];
            }
        }
        __syncthreads();
        // online softmax: a warp per head, lane = key
        for (int h = warp; h < group; h += DEC_WARPS) {
            const float sc = lane < n ? s_s[lane][h] : pc_neg_inf();
            const float m_old = m_s[h];
            const float m_new = fmaxf(m_old, warp_max(sc));
            const float p = exp2f(sc - m_new);
            if (lane < n) s_s[lane][h] = p;
            const float sum = warp_sum(p);
            if (lane == 0) {
                const float alpha = exp2f(m_old - m_new);
                alpha_s[h] = alpha;
                l_s[h] = l_s[h] * alpha + sum;
                m_s[h] = m_new;
            }
        }
        __syncthreads();
        // acc = acc * alpha + P V
#pragma unroll
        for (int i = 0; i < HPT; ++i) {
            const int h = hg + i * HG;
            if (h < group) {
                acc[i][0] *= alpha_s[h];
                acc[i][1] *= alpha_s[h];
            }
        }
        for (int j = 0; j < n; ++j) {
            const T* vp = &v_s[st][j * STR + 2 * cp];
            const float v0 = KvType<T>::load(vp[0]), v1 = KvType<T>::load(vp[1]);
#pragma unroll
            for (int i = 0; i < HPT; ++i) {
                const int h = hg + i * HG;
                if (h < group) {
                    const float p = s_s[j][h];
                    acc[i][0] += p * v0;
                    acc[i][1] += p * v1;
                }
            }
        }
        __syncthreads();                               // stage `st` is free for tile it + 2
    }
    cp_async_wait<0>();
    __syncthreads();                                   // l_s / m_s final (also for an empty split)

#pragma unroll
    for (int i = 0; i < HPT; ++i) {
        const int h = hg + i * HG;
        if (h >= group) continue;
        const float l = l_s[h];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        const int hq = h0 + h;
        const float2 o = make_float2(acc[i][0] * inv, acc[i][1] * inv);
        if (num_splits == 1) {
            *reinterpret_cast<float2*>(out + (i64)b * out_stride + (i64)hq * D + 2 * cp) = o;
        } else {
            const i64 row = ((i64)b * hq_total + hq) * num_splits + split;
            *reinterpret_cast<float2*>(part_o + row * D + 2 * cp) = o;
            if (cp == 0) part_lse[row] = l > 0.0f ? m_s[h] + log2f(l) : pc_neg_inf();
        }
    }
}

#define DECODE_KERNEL(NAME, T, D)                                                                   \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS) NAME(                                \
        const float* __restrict__ q, i64 q_stride, const T* __restrict__ k_cache,                   \
        const T* __restrict__ v_cache, const int* __restrict__ block_tables, int bt_stride,         \
        const int* __restrict__ seq_lens, float* __restrict__ out, i64 out_stride,                 \
        float* __restrict__ part_o, float* __restrict__ part_lse, int num_kv_heads, int group,     \
        int block_size, int num_splits, float scale_log2) {                                         \
        pdl_wait();                                                                                 \
        decode_body<T, D>(q, q_stride, k_cache, v_cache, block_tables, bt_stride, seq_lens, out,    \
                          out_stride, part_o, part_lse, num_kv_heads, group, block_size, num_splits, \
                          scale_log2);                                                              \
    }

DECODE_KERNEL(attn_decode_split_f16_hd16, __half, 16)
DECODE_KERNEL(attn_decode_split_f16_hd32, __half, 32)
DECODE_KERNEL(attn_decode_split_f16_hd64, __half, 64)
DECODE_KERNEL(attn_decode_split_f16_hd128, __half, 128)

// Merges the splits: out[b, h] = sum_s w_s o_s / sum_s w_s, w_s = 2^(lse_s - max lse).
// grid (Hq, B), block of >= head_dim threads (thread d owns column d). The split-KV prefill
// (attn_prefill.cuh) uses it too, with one b per query row. Warp 0 turns the log-sum-exps into
// weights, 32 splits at a time, in shared memory (splits past num_splits and empty ones, lse =
// -inf, get weight 0 and their partial outputs, not written, are not read).
extern "C" __global__ void attn_decode_combine_f32(const float* __restrict__ part_o,
                                                   const float* __restrict__ part_lse,
                                                   float* __restrict__ out, i64 out_stride, int hq_total,
                                                   int head_dim, int num_splits) {
    pdl_wait();
    __shared__ float w_s[32];
    __shared__ float mx_s;
    const int hq = blockIdx.x, b = blockIdx.y, d = threadIdx.x, lane = threadIdx.x & 31;
    const bool warp0 = threadIdx.x < 32;
    const i64 row = ((i64)b * hq_total + hq) * num_splits;
    if (warp0) {
        float mx = pc_neg_inf();
        for (int s = lane; s < num_splits; s += 32) mx = fmaxf(mx, part_lse[row + s]);
        mx = warp_max(mx);
        if (lane == 0) mx_s = mx;
    }
    float num = 0.0f, den = 0.0f;
    for (int s0 = 0; s0 < num_splits; s0 += 32) {
        __syncthreads();                              // mx_s written; the previous weights are used
        if (warp0) {
            const float lse = s0 + lane < num_splits ? part_lse[row + s0 + lane] : pc_neg_inf();
            w_s[lane] = lse == pc_neg_inf() ? 0.0f : exp2f(lse - mx_s);
        }
        __syncthreads();
        float o[32];                                  // every load issued before any is used
#pragma unroll
        for (int j = 0; j < 32; ++j)
            o[j] = w_s[j] != 0.0f && d < head_dim ? part_o[(row + s0 + j) * head_dim + d] : 0.0f;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
            num += w_s[j] * o[j];
            den += w_s[j];
        }
    }
    if (d < head_dim) out[(i64)b * out_stride + (i64)hq * head_dim + d] = den > 0.0f ? num / den : 0.0f;
}
