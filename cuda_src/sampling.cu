// Batched token sampling on the device; one block of SAMP_NT threads per row of logits [B, V].
// Mirrors pocketcupy/sampler.py (the NumPy reference): allowed-mask, raw log-softmax statistics
// for logprobs, min_tokens suppression, repetition/frequency/presence penalties, greedy argmax
// or temperature -> top-k -> top-p -> min-p -> a draw with Philox 4x32-10 keyed by a per-row
// 64-bit seed. Layouts of the per-row parameter and output words: SP_* and SO_* below, mirrored
// in pocketcupy/backend/sampler_cuda.py.
#include "sampling_select.cuh"

// Row parameters: SP_WORDS int32 words per row (f32/f64 fields are bit patterns, f64 lo word first).
#define SP_FLAGS 0
#define SP_TOPK 1     // 0: off
#define SP_NLP 2      // top-N logprobs (0..LP_MAX); used when F_LOGPROBS
#define SP_MASK 3     // row of the packed allowed-mask array, -1: none
#define SP_SEED 4     // u64 seed (2 words)
#define SP_TEMP 6     // f32
#define SP_REP 7      // f32 repetition penalty
#define SP_FREQ 8     // f32 frequency penalty
#define SP_PRES 9     // f64 presence penalty
#define SP_TOPP 11    // f64
#define SP_MINP 13    // f64
#define SP_PROMPT 15  // offset, length in toks: prompt ids (repetition penalty only)
#define SP_OUTPUT 17  // offset, length in toks: output ids
#define SP_SUPP 19    // offset, length in toks: ids suppressed by min_tokens
#define SP_CNT 21     // row of the count scratch (frequency/presence), -1: none
#define SP_WORDS 24

#define F_GREEDY 1
#define F_EDITS 2     // the row has penalties or suppressed ids: edited values live in the work row
#define F_LOGPROBS 4
#define F_FREQPRES 8

// Outputs: SO_WORDS int32 words per row.
#define SO_TOK 0
#define SO_LP 1       // f32 logprob of the sampled token (raw, after the allowed-mask)
#define SO_RANK 2     // 1 + #tokens with a strictly greater logprob
#define SO_N 3        // number of top logprobs written, -1: none requested
#define SO_IDS 4      // LP_MAX ids, descending logprob (ties: lower id first)
#define SO_LPS 24     // LP_MAX f32 logprobs
#define SO_MINKEPT 44 // f32: smallest value (logit / T) left after top-k/top-p/min-p (random rows)
#define SO_KEPT 45    // number of tokens left to sample from (random rows)
#define SO_WORDS 48

__device__ __forceinline__ double p_f64(const int* P, int w) { return __hiloint2double(P[w + 1], P[w]); }

// Penalties and min_tokens suppression on the work row (which holds the masked raw logits).
// Duplicate ids are harmless: repetition writes are idempotent, and frequency counts go through
// a per-row int scratch that is zeroed before use and left zeroed.
__device__ void sparse_edits(const RowSrc& raw, float* w, int* cnt, const int* P, const int* toks, int V) {
    const int tid = threadIdx.x, nt = blockDim.x;
    const float rp = __int_as_float(P[SP_REP]);
    const int po = P[SP_PROMPT], pl = P[SP_PROMPT + 1], oo = P[SP_OUTPUT], ol = P[SP_OUTPUT + 1];
    for (int j = tid; j < pl + ol; j += nt) {
        const int t = j < pl ? toks[po + j] : toks[oo + j - pl];
        if (t >= 0 && t < V) {
            const float x = raw(t);
            w[t] = x > 0.0f ? x / rp : x * rp;
        }
    }
    __syncthreads();
    if (P[SP_FLAGS] & F_FREQPRES) {
        for (int j = tid; j < ol; j += nt) {
            const int t = toks[oo + j];
            if (t >= 0 && t < V) cnt[t] = 0;
        }
        __syncthreads();
        for (int j = tid; j < ol; j += nt) {
            const int t = toks[oo + j];
            if (t >= 0 && t < V) atomicAdd(&cnt[t], 1);
        }
        __syncthreads();
        const float ff = __int_as_float(P[SP_FREQ]);
        const double pres = p_f64(P, SP_PRES);
        for (int j = tid; j < ol; j += nt) {
            const int t = toks[oo + j];
            if (t < 0 || t >= V) continue;
            const int c = atomicExch(&cnt[t], 0);  // one thread per distinct id sees c > 0
            if (c > 0) {
                const float x = raw(t), r = x > 0.0f ? x / rp : x * rp;
                // as NumPy: float32(f * count) + presence in float64, subtracted in float64
                w[t] = (float)((double)r - ((double)(ff * (float)c) + pres));
            }
        }
        __syncthreads();
    }
    const int so = P[SP_SUPP], sl = P[SP_SUPP + 1];
    for (int j = tid; j < sl; j += nt) {
        const int t = toks[so + j];
        if (t >= 0 && t < V) w[t] = pc_neg_inf();
    }
    __syncthreads();
}

// One value of the raw pass: into the work row, the log-softmax statistics and the argmax.
__device__ __forceinline__ void raw_take(float x, int i, float* w, bool lse, float& m, float& z, float& av, int& ai) {
    if (w) w[i] = x;
    if (lse && x != pc_neg_inf()) {
        if (x > m) { z = z * expf(m - x) + 1.0f; m = x; }
        else z += expf(x - m);
    }
    argmax_merge(av, ai, x, i);
}

// Masked raw logits: optional copy into the work row, log-softmax statistics and argmax.
// A 16-byte aligned row is read as float4, U loads in flight a thread (a block reads a
// 49152-value row in two rounds); the rest, or an unaligned row, value by value.
__device__ void raw_pass(const RowSrc& raw, int V, float* w, bool lse, bool amax, float& m, float& z,
                         float& av, int& ai, SelShared& s) {
    m = pc_neg_inf(); z = 0.0f; av = pc_neg_inf(); ai = 0x7fffffff;
    constexpr int U = 8;
    const int V4 = (reinterpret_cast<size_t>(raw.p) & 15) == 0 ? V / 4 : 0;
    for (int j0 = threadIdx.x; j0 < V4; j0 += U * blockDim.x) {
        float4 xs[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int j = j0 + u * blockDim.x;
            xs[u] = j < V4 ? raw.load4(j) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int j = j0 + u * blockDim.x;
            if (j >= V4) break;
            raw_take(xs[u].x, 4 * j, w, lse, m, z, av, ai);
            raw_take(xs[u].y, 4 * j + 1, w, lse, m, z, av, ai);
            raw_take(xs[u].z, 4 * j + 2, w, lse, m, z, av, ai);
            raw_take(xs[u].w, 4 * j + 3, w, lse, m, z, av, ai);
        }
    }
    for (int i0 = 4 * V4 + threadIdx.x; i0 < V; i0 += U * blockDim.x) {
        float xs[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int i = i0 + u * blockDim.x;
            xs[u] = i < V ? raw(i) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int i = i0 + u * blockDim.x;
            if (i >= V) break;
            raw_take(xs[u], i, w, lse, m, z, av, ai);
        }
    }
    if (lse) block_lse(m, z, s);
    if (amax) block_argmax(av, ai, s);
    __syncthreads();
}

// Top-N logprobs of the raw row and the rank of `tok`, written to o[SO_LP ... SO_LPS + LP_MAX).
// lp = (x - m) - L in float32, as the NumPy log_softmax.
__device__ void logprobs_row(const RowSrc& raw, int V, int tok, int n, float m, float L, SelShared& s, int* o) {
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
    const float lp_tok = (raw(tok) - m) - L;
    u32 K = 0u, gt = 0u, need = 0u;
    bool all = true;
    if (n > 0) {
        const SelResult r = radix_select<false>(raw, V, (u32)n, 0u, 0.0f, 0.0, s);
        K = r.key; gt = r.gt; need = (u32)n - gt; all = r.eq == need;
    }
    if (tid == 0) s.nlist = 0u;
    __syncthreads();
    u64 above = 0ull;
    for (int i = tid; i < V; i += nt) {
        const float x = raw(i);
        above += ((x - m) - L) > lp_tok;
        if (n > 0) {
            const u32 key = fkey(x);
            if (key > K || (all && key == K)) s.list[atomicAdd(&s.nlist, 1u)] = i;
        }
    }
    const u64 rank = block_sum_u64(above, s) + 1ull;
    if (n > 0 && !all) {  // more ties at the N-th value than places left: lowest ids, in order
        u32 taken = 0u;
        for (int base = 0; base < V && taken < need; base += nt) {
            const int i = base + tid;
            const bool f = i < V && fkey(raw(i)) == K;
            const u32 bal = __ballot_sync(PC_FULL_MASK, f);
            if (lane == 0) s.wcnt[warp] = __popc(bal);
            __syncthreads();
            u32 off = 0u, tot = 0u;
            for (int w2 = 0; w2 < (nt >> 5); ++w2) {
                const u32 c = s.wcnt[w2];
                off += w2 < warp ? c : 0u;
                tot += c;
            }
            const u32 pos = taken + off + __popc(bal & ((1u << lane) - 1u));
            if (f && pos < need) s.list[gt + pos] = i;
            taken += tot;
            __syncthreads();
        }
    }
    __syncthreads();
    if (tid == 0) {
        float lps[LP_MAX];
        int ids[LP_MAX];
        for (int j = 0; j < n; ++j) {
            const int t = s.list[j];
            const float v = (raw(t) - m) - L;
            int q = j;
            while (q > 0 && (lps[q - 1] < v || (lps[q - 1] == v && ids[q - 1] > t))) {
                lps[q] = lps[q - 1]; ids[q] = ids[q - 1]; --q;
            }
            lps[q] = v; ids[q] = t;
        }
        for (int j = 0; j < n; ++j) { o[SO_IDS + j] = ids[j]; o[SO_LPS + j] = __float_as_int(lps[j]); }
        o[SO_LP] = __float_as_int(lp_tok);
        o[SO_RANK] = (int)rank;
        o[SO_N] = n;
    }
}

// Exponential race over the kept values x (key >= tau, finite): argmax x - log(E), E ~ Exp(1)
// from Philox (counter = 4-element group, key = seed) picks i with probability softmax(x)_i.
// Falls back to the argmax when nothing is kept (every value -inf).
__device__ int race(const RowSrc& src, int V, u32 tau, uint2 seed, float& min_kept, int& kept, SelShared& s) {
    float best = pc_neg_inf(), av = pc_neg_inf(), mk = __int_as_float(0x7f800000);
    int bi = 0x7fffffff, ai = 0x7fffffff, nk = 0;
    const int G = (V + 3) >> 2;
    for (int g = threadIdx.x; g < G; g += blockDim.x) {
        float x[4];
        bool kp[4], any = false;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int i = 4 * g + q;
            x[q] = i < V ? src(i) : pc_neg_inf();
            kp[q] = i < V && x[q] != pc_neg_inf() && fkey(x[q]) >= tau;
            any |= kp[q];
            if (i < V) argmax_merge(av, ai, x[q], i);
        }
        if (!any) continue;
        const uint4 r = philox4x32_10(make_uint4((u32)g, 0u, 0u, 0u), seed);
        const u32 rr[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            if (!kp[q]) continue;
            ++nk;
            mk = fminf(mk, x[q]);
            const float u = fminf(fmaf((float)rr[q], 0x1p-32f, 0x1p-33f), 0x1.fffffep-1f);
            // E = -log1p(-u) >= u, so a key above `best` needs u < exp(x - best): skip the logs.
            if (u < __expf(x[q] - best) * 1.001f) {
                const float e = -log1pf(-u);
                argmax_merge(best, bi, x[q] - logf(e), 4 * g + q);
            }
        }
    }
    block_argmax(best, bi, s);
    block_argmax(av, ai, s);
    min_kept = -block_max(-mk, s);
    kept = (int)block_sum_u64((u64)nk, s);
    return bi < V ? bi : (ai < V ? ai : 0);
}

// One row per block: the sampler of sample_rows_f32 and sample_rows_at_f32.
__device__ __forceinline__ void
sample_row(const float* __restrict__ logits, i64 ld, int V, const int* __restrict__ params,
           const int* __restrict__ toks, const u32* __restrict__ masks, i64 mask_words,
           float* __restrict__ work, i64 ld_work, int* __restrict__ cnt, i64 ld_cnt, int* __restrict__ out) {
    __shared__ SelShared s;
    const int row = blockIdx.x, tid = threadIdx.x;
    const int* P = params + (i64)row * SP_WORDS;
    const int flags = P[SP_FLAGS], mrow = P[SP_MASK], crow = P[SP_CNT];
    const bool greedy = flags & F_GREEDY, edits = flags & F_EDITS, want_lp = flags & F_LOGPROBS;
    const RowSrc raw = {logits + (i64)row * ld, mrow >= 0 ? masks + (i64)mrow * mask_words : nullptr, 1.0f, false};
    float* w = work + (i64)row * ld_work;
    int* o = out + (i64)row * SO_WORDS;

    float m_r = 0.0f, z_r = 1.0f, av = 0.0f, min_kept = 0.0f;
    int ai = 0, kept = 0, tok;
    if (edits || want_lp || greedy)
        raw_pass(raw, V, edits ? w : nullptr, want_lp, greedy && !edits, m_r, z_r, av, ai, s);
    if (edits) sparse_edits(raw, w, crow >= 0 ? cnt + (i64)crow * ld_cnt : nullptr, P, toks, V);

    if (greedy) {
        if (edits) {
            av = pc_neg_inf(); ai = 0x7fffffff;
            for (int i = tid; i < V; i += blockDim.x) argmax_merge(av, ai, w[i], i);
            block_argmax(av, ai, s);
        }
        tok = ai < V ? ai : 0;
    } else {
        const int topk = P[SP_TOPK];
        const double top_p = p_f64(P, SP_TOPP), min_p = p_f64(P, SP_MINP);
        const float T = __int_as_float(P[SP_TEMP]);
        RowSrc src = edits ? RowSrc{w, nullptr, T, true} : RowSrc{raw.p, raw.mask, T, true};
        u32 tau = 0u;
        if ((topk > 0 && topk < V) || top_p < 1.0 || min_p > 0.0) {
            float mx = pc_neg_inf();
            for (int i = tid; i < V; i += blockDim.x) {  // logits / T into the work row, once
                const float x = src(i);
                w[i] = x;
                mx = fmaxf(mx, x);
            }
            mx = block_max(mx, s);
            src = RowSrc{w, nullptr, 1.0f, false};
            // vLLM v1's order: min-p, top-k, then top-p over the mass of what they leave
            if (min_p > 0.0) tau = fkey(__double2float_ru((double)mx + log(min_p)));
            if (topk > 0 && topk < V) tau = max(tau, radix_select<false>(src, V, (u32)topk, 0u, 0.0f, 0.0, s).key);
            if (top_p < 1.0) {
                const u32 fl = tau > KEY_NEG_INF ? tau : KEY_NEG_INF + 1u;
                tau = max(tau, radix_select<true>(src, V, 0u, fl, mx, top_p, s).key);
            }
        }
        tok = race(src, V, tau, make_uint2((u32)P[SP_SEED], (u32)P[SP_SEED + 1]), min_kept, kept, s);
    }

    if (want_lp) logprobs_row(raw, V, tok, P[SP_NLP], m_r, logf(z_r), s, o);
    if (tid == 0) {
        o[SO_TOK] = tok;
        o[SO_MINKEPT] = __float_as_int(min_kept);
        o[SO_KEPT] = kept;
        if (!want_lp) o[SO_N] = -1;
    }
}

extern "C" __global__ void __launch_bounds__(SAMP_NT)
sample_rows_f32(const float* __restrict__ logits, i64 ld, int V, const int* __restrict__ params,
                const int* __restrict__ toks, const u32* __restrict__ masks, i64 mask_words,
                float* __restrict__ work, i64 ld_work, int* __restrict__ cnt, i64 ld_cnt, int* __restrict__ out) {
    pdl_wait();
    sample_row(logits, ld, V, params, toks, masks, mask_words, work, ld_work, cnt, ld_cnt, out);
}

// sample_rows_f32 writing to the address held in out_at[0], read when it runs: a decode graph
// captures this launch and alternates its result buffers step by step.
extern "C" __global__ void __launch_bounds__(SAMP_NT)
sample_rows_at_f32(const float* __restrict__ logits, i64 ld, int V, const int* __restrict__ params,
                   const int* __restrict__ toks, const u32* __restrict__ masks, i64 mask_words,
                   float* __restrict__ work, i64 ld_work, int* __restrict__ cnt, i64 ld_cnt,
                   const i64* __restrict__ out_at) {
    pdl_wait();
    sample_row(logits, ld, V, params, toks, masks, mask_words, work, ld_work, cnt, ld_cnt,
               reinterpret_cast<int*>(out_at[0]));
}

// Prompt logprobs: top-N logprobs of each row and the rank/logprob of tokens[row].
extern "C" __global__ void __launch_bounds__(SAMP_NT)
topk_logprobs_f32(const float* __restrict__ logits, i64 ld, int V, const int* __restrict__ tokens, int n,
                  int* __restrict__ out) {
    pdl_wait();
    __shared__ SelShared s;
    const RowSrc raw = {logits + (i64)blockIdx.x * ld, nullptr, 1.0f, false};
    int* o = out + (i64)blockIdx.x * SO_WORDS;
    float m, z, av;
    int ai;
    raw_pass(raw, V, nullptr, true, false, m, z, av, ai, s);
    const int t = tokens[blockIdx.x];
    logprobs_row(raw, V, t >= 0 && t < V ? t : 0, n, m, logf(z), s, o);
    if (threadIdx.x == 0) { o[SO_TOK] = t; o[SO_MINKEPT] = 0; o[SO_KEPT] = 0; }
}

extern "C" __global__ void __launch_bounds__(SAMP_NT)
argmax_rows_f32(const float* __restrict__ logits, i64 ld, int V, int* __restrict__ out) {
    pdl_wait();
    __shared__ SelShared s;
    const float* x = logits + (i64)blockIdx.x * ld;
    float av = pc_neg_inf();
    int ai = 0x7fffffff;
    for (int i = threadIdx.x; i < V; i += blockDim.x) argmax_merge(av, ai, x[i], i);
    block_argmax(av, ai, s);
    if (threadIdx.x == 0) out[blockIdx.x] = ai < V ? ai : 0;
}

// Philox 4x32-10 blocks for the RNG's known-answer test: out[j] = philox(ctr[j], key).
extern "C" __global__ void philox4x32_fill(const uint4* __restrict__ ctr, unsigned k0, unsigned k1,
                                           uint4* __restrict__ out, int n) {
    pdl_wait();
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < n) out[j] = philox4x32_10(ctr[j], make_uint2(k0, k1));
}
