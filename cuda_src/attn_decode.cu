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
#define DEC_TILE 64      // keys per smem tile
#define DEC_MAXG 16      // most query heads per KV head

// Lane `lane` holds elements [lane*EPL, lane*EPL + EPL) of a D-long row (lanes >= D idle for D < 32).
template <int D> struct RowLanes {
    static constexpr int EPL = D >= 32 ? D / 32 : 1;
};

template <typename T, int EPL>
__device__ __forceinline__ void load_row_lane(const T* row, int lane, int D, float* dst) {
#pragma unroll
    for (int e = 0; e < EPL; ++e) {
        const int d = lane * EPL + e;
        dst[e] = d < D ? KvType<T>::load(row[d]) : 0.0f;
    }
}

template <typename T, int D>
__device__ __forceinline__ void decode_body(
    const float* __restrict__ q, i64 q_stride, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
    const int* __restrict__ block_tables, int bt_stride, const int* __restrict__ seq_lens,
    float* __restrict__ out, i64 out_stride, float* __restrict__ part_o, float* __restrict__ part_lse,
    int num_kv_heads, int group, int block_size, int num_splits, float scale_log2) {
    constexpr int EPL = RowLanes<D>::EPL;
    constexpr int HG = D >= DEC_THREADS ? 1 : DEC_THREADS / D;       // head groups in the PV phase
    constexpr int CPT = D >= DEC_THREADS ? D / DEC_THREADS : 1;      // columns per thread
    constexpr int HPT = (DEC_MAXG + HG - 1) / HG;                     // heads per thread (max)

    __shared__ float q_s[DEC_MAXG][D];
    __shared__ float s_s[DEC_TILE][DEC_MAXG];
    __shared__ i64 slot_s[DEC_TILE];
    __shared__ float m_s[DEC_MAXG], l_s[DEC_MAXG], alpha_s[DEC_MAXG];

    const int split = blockIdx.x, kh = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int hq_total = num_kv_heads * group, h0 = kh * group;
    const int ctx = seq_lens[b];
    int chunk = (ctx + num_splits - 1) / num_splits;
    chunk = max(DEC_TILE, (chunk + 15) & ~15);        // short contexts use fewer, fuller splits
    const int k_begin = split * chunk;
    const int k_end = min(ctx, k_begin + chunk);
    if (k_begin >= k_end && split > 0) {               // empty split: only its weight (zero) is written
        if (tid < group) part_lse[((i64)b * hq_total + h0 + tid) * num_splits + split] = pc_neg_inf();
        return;
    }

    for (int i = tid; i < group * D; i += DEC_THREADS)
        q_s[i / D][i % D] = q[(i64)b * q_stride + (i64)h0 * D + i] * scale_log2;
    if (tid < DEC_MAXG) { m_s[tid] = pc_neg_inf(); l_s[tid] = 0.0f; alpha_s[tid] = 1.0f; }

    // PV-phase ownership: column(s) d = col0 + c*DEC_THREADS, heads hg, hg + HG, ...
    const int hg = tid / (D < DEC_THREADS ? D : DEC_THREADS);
    const int col0 = tid % (D < DEC_THREADS ? D : DEC_THREADS);
    float acc[HPT][CPT];
#pragma unroll
    for (int i = 0; i < HPT; ++i)
#pragma unroll
        for (int c = 0; c < CPT; ++c) acc[i][c] = 0.0f;

    for (int t0 = k_begin; t0 < k_end; t0 += DEC_TILE) {
        const int n = min(DEC_TILE, k_end - t0);
        __syncthreads();  // previous tile fully consumed; q_s / m_s initialised
        if (tid < n) {
            const int p = t0 + tid;
            slot_s[tid] = (i64)block_tables[(i64)b * bt_stride + p / block_size] * block_size + p % block_size;
        }
        __syncthreads();
        // scores: a warp per key, lanes split the head dim
        for (int j = warp; j < n; j += DEC_WARPS) {
            float kv[EPL];
            load_row_lane<T, EPL>(k_cache + (slot_s[j] * num_kv_heads + kh) * D, lane, D, kv);
            for (int h = 0; h < group; ++h) {
                float s = 0.0f;
#pragma unroll
                for (int e = 0; e < EPL; ++e) {
                    const int d = lane * EPL + e;
                    if (d < D) s += q_s[h][d] * kv[e];
                }
                s = warp_sum(s);
                if (lane == 0) s_s[j][h] = s;
            }
        }
        __syncthreads();
        // online softmax: a warp per head
        for (int h = warp; h < group; h += DEC_WARPS) {
            float mx = pc_neg_inf();
            for (int j = lane; j < n; j += 32) mx = fmaxf(mx, s_s[j][h]);
            mx = warp_max(mx);
            const float m_old = m_s[h];
            const float m_new = fmaxf(m_old, mx);
            float sum = 0.0f;
            for (int j = lane; j < n; j += 32) {
                const float p = exp2f(s_s[j][h] - m_new);
                s_s[j][h] = p;
                sum += p;
            }
            sum = warp_sum(sum);
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
                const float a = alpha_s[h];
#pragma unroll
                for (int c = 0; c < CPT; ++c) acc[i][c] *= a;
            }
        }
        for (int j = 0; j < n; ++j) {
            const T* vrow = v_cache + (slot_s[j] * num_kv_heads + kh) * D;
            float vv[CPT];
#pragma unroll
            for (int c = 0; c < CPT; ++c) vv[c] = KvType<T>::load(vrow[col0 + c * DEC_THREADS]);
#pragma unroll
            for (int i = 0; i < HPT; ++i) {
                const int h = hg + i * HG;
                if (h < group) {
                    const float p = s_s[j][h];
#pragma unroll
                    for (int c = 0; c < CPT; ++c) acc[i][c] += p * vv[c];
                }
            }
        }
    }
    __syncthreads();  // l_s / m_s final (also covers an empty split)

#pragma unroll
    for (int i = 0; i < HPT; ++i) {
        const int h = hg + i * HG;
        if (h >= group) continue;
        const float l = l_s[h];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        const int hq = h0 + h;
        if (num_splits == 1) {
#pragma unroll
            for (int c = 0; c < CPT; ++c) out[(i64)b * out_stride + (i64)hq * D + col0 + c * DEC_THREADS] = acc[i][c] * inv;
        } else {
            const i64 row = ((i64)b * hq_total + hq) * num_splits + split;
#pragma unroll
            for (int c = 0; c < CPT; ++c) part_o[row * D + col0 + c * DEC_THREADS] = acc[i][c] * inv;
            if (col0 == 0) part_lse[row] = l > 0.0f ? m_s[h] + log2f(l) : pc_neg_inf();
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
        decode_body<T, D>(q, q_stride, k_cache, v_cache, block_tables, bt_stride, seq_lens, out,    \
                          out_stride, part_o, part_lse, num_kv_heads, group, block_size, num_splits, \
                          scale_log2);                                                              \
    }

DECODE_KERNEL(attn_decode_split_f16_hd16, __half, 16)
DECODE_KERNEL(attn_decode_split_f16_hd32, __half, 32)
DECODE_KERNEL(attn_decode_split_f16_hd64, __half, 64)
DECODE_KERNEL(attn_decode_split_f16_hd128, __half, 128)

// Merges the splits: out[b, h] = sum_s w_s o_s / sum_s w_s, w_s = 2^(lse_s - max lse).
// grid (Hq, B), block 128 (threads loop over D).
extern "C" __global__ void attn_decode_combine_f32(const float* __restrict__ part_o,
                                                   const float* __restrict__ part_lse,
                                                   float* __restrict__ out, i64 out_stride, int hq_total,
                                                   int head_dim, int num_splits) {
    const int hq = blockIdx.x, b = blockIdx.y;
    const i64 row = ((i64)b * hq_total + hq) * num_splits;
    float mx = pc_neg_inf();
    for (int s = 0; s < num_splits; ++s) mx = fmaxf(mx, part_lse[row + s]);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float num = 0.0f, den = 0.0f;
        for (int s = 0; s < num_splits; ++s) {
            const float lse = part_lse[row + s];
            if (lse == pc_neg_inf()) continue;      // empty split: its partial output is not written
            const float w = exp2f(lse - mx);
            num += w * part_o[(row + s) * head_dim + d];
            den += w;
        }
        out[(i64)b * out_stride + (i64)hq * head_dim + d] = den > 0.0f ? num / den : 0.0f;
    }
}
