// Device helpers of the sampler (sampling.cu): Philox 4x32-10, order-preserving float keys,
// block reductions, and a block-wide radix select over one row of the vocabulary that finds
//   - by count: the k-th largest key (top-k, top-N logprobs), or
//   - by mass:  the top-p cut (the smallest key whose strictly-greater mass is < top_p * Z).
// One block of SAMP_NT threads works on one row; each select pass re-reads the row (L2-resident).
#pragma once

#include "common.cuh"

#define SAMP_NT 1024     // threads per block (one block per row)
#define SEL_NB 2048      // histogram bins (digits of 11, 11 and 10 bits)
#define SEL_CAP 2048     // a bucket this small is gathered into shared memory and sorted
#define LP_MAX 20        // most top-N logprobs per row
#define WFIX_SCALE 1099511627776.0f  // 2^40: probability weights exp(x - max) in fixed point

struct SelShared {
    u32 cnt[SEL_NB];
    u32 mlo[SEL_NB];     // 64-bit mass per bin, split so that only native 32-bit atomics are used
    u32 mhi[SEL_NB];
    u32 cand[SEL_CAP];
    u64 scan[33];
    float redf[32];
    int redi[32];
    u32 sel, ncand, nlist, wcnt[32];
    u64 sel_c, sel_m;
    int list[32];
};

struct SelResult {
    u32 key;  // the selected key
    u32 gt;   // count mode: participants with a greater key
    u32 eq;   // count mode: participants with this key
};

// ---- Philox 4x32-10 (Salmon et al. 2011, as Random123's philox4x32_R(10, ...)) -------------
__device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint2 k) {
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r) { k.x += 0x9E3779B9u; k.y += 0xBB67AE85u; }
        const u32 hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
        const u32 hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
        c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    }
    return c;
}

// ---- keys: unsigned order equals float order (-0.0 folded onto +0.0) ------------------------
__device__ __forceinline__ u32 fkey(float x) {
    u32 u = __float_as_uint(x);
    if (u == 0x80000000u) u = 0u;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float kval(u32 k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
#define KEY_NEG_INF 0x007fffffu  // fkey(-inf)

__device__ __forceinline__ u64 wfix(float x, float m) {
    return (u64)__float2ull_rz(expf(x - m) * WFIX_SCALE);
}

// One row of values as the sampler sees it: p[i] (raw logits or the work row), forbidden tokens
// of the packed allowed-mask as -inf, divided by t when `scale`.
struct RowSrc {
    const float* p;
    const u32* mask;
    float t;
    bool scale;
    __device__ __forceinline__ float operator()(int i) const {
        float v = p[i];
        if (mask && !((mask[i >> 5] >> (i & 31)) & 1u)) v = pc_neg_inf();
        return scale ? v / t : v;
    }
    // values 4j .. 4j + 3 (p 16-byte aligned)
    __device__ __forceinline__ float4 load4(int j) const {
        float4 v = reinterpret_cast<const float4*>(p)[j];
        if (mask) {
            const u32 bits = mask[j >> 3] >> ((j & 7) * 4);
            if (!(bits & 1u)) v.x = pc_neg_inf();
            if (!(bits & 2u)) v.y = pc_neg_inf();
            if (!(bits & 4u)) v.z = pc_neg_inf();
            if (!(bits & 8u)) v.w = pc_neg_inf();
        }
        if (scale) { v.x /= t; v.y /= t; v.z /= t; v.w /= t; }
        return v;
    }
};

// ---- block reductions (every thread gets the result; each call synchronises) ----------------
__device__ __forceinline__ void argmax_merge(float& v, int& i, float v2, int i2) {
    if (v2 > v || (v2 == v && i2 < i)) { v = v2; i = i2; }
}

__device__ __forceinline__ void block_argmax(float& v, int& i, SelShared& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v2 = __shfl_xor_sync(PC_FULL_MASK, v, o);
        const int i2 = __shfl_xor_sync(PC_FULL_MASK, i, o);
        argmax_merge(v, i, v2, i2);
    }
    __syncthreads();
    if (lane == 0) { s.redf[warp] = v; s.redi[warp] = i; }
    __syncthreads();
    v = lane < nw ? s.redf[lane] : pc_neg_inf();
    i = lane < nw ? s.redi[lane] : 0x7fffffff;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v2 = __shfl_xor_sync(PC_FULL_MASK, v, o);
        const int i2 = __shfl_xor_sync(PC_FULL_MASK, i, o);
        argmax_merge(v, i, v2, i2);
    }
}

__device__ __forceinline__ float block_max(float v, SelShared& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) s.redf[warp] = v;
    __syncthreads();
    return warp_max(lane < nw ? s.redf[lane] : pc_neg_inf());
}

__device__ __forceinline__ u64 warp_sum_u64(u64 v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(PC_FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ u64 block_sum_u64(u64 v, SelShared& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_u64(v);
    __syncthreads();
    if (lane == 0) s.scan[warp] = v;
    __syncthreads();
    return warp_sum_u64(lane < nw ? s.scan[lane] : 0ull);
}

// Online softmax statistics (max, sum of exp(x - max)) merged over the block.
__device__ __forceinline__ void lse_merge(float& m, float& z, float m2, float z2) {
    const float M = fmaxf(m, m2);
    if (M == pc_neg_inf()) return;
    z = z * expf(m - M) + z2 * expf(m2 - M);
    m = M;
}

__device__ __forceinline__ void block_lse(float& m, float& z, SelShared& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        lse_merge(m, z, __shfl_xor_sync(PC_FULL_MASK, m, o), __shfl_xor_sync(PC_FULL_MASK, z, o));
    __syncthreads();
    if (lane == 0) { s.redf[warp] = m; s.scan[warp] = (u64)__float_as_uint(z); }
    __syncthreads();
    m = lane < nw ? s.redf[lane] : pc_neg_inf();
    z = lane < nw ? __uint_as_float((u32)s.scan[lane]) : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        lse_merge(m, z, __shfl_xor_sync(PC_FULL_MASK, m, o), __shfl_xor_sync(PC_FULL_MASK, z, o));
}

// Exclusive prefix sum in thread order; *total gets the block total.
__device__ __forceinline__ u64 block_excl_scan_u64(u64 v, SelShared& s, u64* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    u64 x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u64 y = __shfl_up_sync(PC_FULL_MASK, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();
    if (lane == 31) s.scan[warp] = x;
    __syncthreads();
    if (warp == 0) {
        const u64 w = lane < nw ? s.scan[lane] : 0ull;
        u64 t = w;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const u64 y = __shfl_up_sync(PC_FULL_MASK, t, o);
            if (lane >= o) t += y;
        }
        s.scan[lane] = t - w;
        if (lane == 31) s.scan[32] = t;
    }
    __syncthreads();
    *total = s.scan[32];
    return s.scan[warp] + x - v;
}

// ---- radix select --------------------------------------------------------------------------
template <bool MASS>
__device__ __forceinline__ void hist_add(SelShared& s, u32 b, u64 w) {
    atomicAdd(&s.cnt[b], 1u);
    if (MASS) {
        const u32 lo = (u32)w;
        u32 hi = (u32)(w >> 32);
        const u32 old = atomicAdd(&s.mlo[b], lo);
        if (old + lo < old) hi += 1u;  // carry out of the low word
        if (hi) atomicAdd(&s.mhi[b], hi);
    }
}

__device__ __forceinline__ u64 bin_mass(const SelShared& s, u32 b) {
    return ((u64)s.mhi[b] << 32) + (u64)s.mlo[b];
}

// Bitonic sort of cand[0, n) descending (n <= SEL_CAP; padded with key 0).
__device__ void sort_cand_desc(SelShared& s, u32 n) {
    u32 np2 = 2;
    while (np2 < n) np2 <<= 1;
    for (u32 i = n + threadIdx.x; i < np2; i += blockDim.x) s.cand[i] = 0u;
    __syncthreads();
    for (u32 k = 2; k <= np2; k <<= 1) {
        for (u32 j = k >> 1; j > 0; j >>= 1) {
            for (u32 i = threadIdx.x; i < np2; i += blockDim.x) {
                const u32 p = i ^ j;
                if (p > i) {
                    const u32 a = s.cand[i], b = s.cand[p];
                    const bool desc = (i & k) == 0;
                    if (desc ? a < b : a > b) { s.cand[i] = b; s.cand[p] = a; }
                }
            }
            __syncthreads();
        }
    }
}

// Participants: elements with key >= floor_key. Count mode (MASS = false): the k-th largest
// participant key (1 <= k <= #participants). Mass mode: with weights wfix(x, m) and Z their
// total, the smallest key whose strictly-greater mass is < top_p * Z (keep keys >= it).
// Digits of 11, 11, 10 bits from the top; a bucket of <= SEL_CAP elements is finished in shared
// memory. All threads of the block must call it; it synchronises.
template <bool MASS, class Src>
__device__ SelResult radix_select(const Src& src, int V, u32 k, u32 floor_key, float m, double top_p,
                                  SelShared& s) {
    const int tid = threadIdx.x, nt = blockDim.x;
    u32 prefix = 0u, pmask = 0u, above_c = 0u;
    u64 above_m = 0ull;
    double target = 0.0;
    SelResult res = {0u, 0u, 0u};
    for (int d = 0; d < 3; ++d) {
        const int shift = d == 0 ? 21 : (d == 1 ? 10 : 0);
        const u32 nb = d == 2 ? 1024u : 2048u;
        __syncthreads();
        for (u32 b = tid; b < nb; b += nt) {
            s.cnt[b] = 0u;
            if (MASS) { s.mlo[b] = 0u; s.mhi[b] = 0u; }
        }
        if (tid == 0) { s.sel = 0xffffffffu; s.ncand = 0u; }
        __syncthreads();
        for (int i = tid; i < V; i += nt) {
            const float x = src(i);
            const u32 key = fkey(x);
            if (key >= floor_key && (key & pmask) == prefix)
                hist_add<MASS>(s, (key >> shift) & (nb - 1u), MASS ? wfix(x, m) : 0ull);
        }
        __syncthreads();
        // Thread t owns bins nb-1-per*t-q (q < per): a scan in thread order is a suffix scan.
        const u32 per = (nb + nt - 1) / nt;
        u64 c_loc = 0ull, m_loc = 0ull;
        for (u32 q = 0; q < per; ++q) {
            const u32 j = tid * per + q;
            if (j < nb) {
                c_loc += s.cnt[nb - 1u - j];
                if (MASS) m_loc += bin_mass(s, nb - 1u - j);
            }
        }
        u64 tot_c, tot_m = 0ull;
        const u64 ex_c = block_excl_scan_u64(c_loc, s, &tot_c);
        const u64 ex_m = MASS ? block_excl_scan_u64(m_loc, s, &tot_m) : 0ull;
        if (MASS && d == 0) target = top_p * (double)tot_m;
        for (int pass = 0; pass < (MASS ? 2 : 1); ++pass) {
            u64 sc = ex_c, sm = ex_m;
            for (u32 q = 0; q < per; ++q) {
                const u32 j = tid * per + q;
                if (j >= nb) break;
                const u32 b = nb - 1u - j, c = s.cnt[b];
                const u64 mb = MASS ? bin_mass(s, b) : 0ull;
                if (!MASS) {
                    if (above_c + sc < k && k <= above_c + sc + c) { s.sel = b; s.sel_c = sc; }
                } else if (pass == 0) {
                    if (c > 0u && (double)(above_m + sm) < target) atomicMin(&s.sel, b);
                } else if (b == s.sel) {
                    s.sel_c = sc;
                    s.sel_m = sm;
                }
                sc += c;
                sm += mb;
            }
            __syncthreads();
        }
        const u32 b = s.sel;
        if (b >= nb) {  // no participant (callers keep 1 <= k <= #participants)
            res.key = floor_key;
            break;
        }
        above_c += (u32)s.sel_c;
        if (MASS) above_m += s.sel_m;
        const u32 bc = s.cnt[b];
        prefix |= b << shift;
        pmask |= (nb - 1u) << shift;
        if (d == 2) {
            res.key = prefix; res.gt = above_c; res.eq = bc;
            break;
        }
        if (bc > SEL_CAP) continue;
        // Finish in shared memory: gather the bucket, sort it, pick.
        __syncthreads();
        for (int i = tid; i < V; i += nt) {
            const u32 key = fkey(src(i));
            if (key >= floor_key && (key & pmask) == prefix) s.cand[atomicAdd(&s.ncand, 1u)] = key;
        }
        __syncthreads();
        const u32 n = s.ncand;
        sort_cand_desc(s, n);
        if (!MASS) {
            const u32 kk = s.cand[k - above_c - 1u];
            if (tid == 0) { s.sel_c = 0ull; s.sel_m = 0ull; }
            __syncthreads();
            u32 g = 0u, e = 0u;
            for (u32 j = tid; j < n; j += nt) { g += s.cand[j] > kk; e += s.cand[j] == kk; }
            if (g) atomicAdd(&s.sel_c, (u64)g);
            if (e) atomicAdd(&s.sel_m, (u64)e);
            __syncthreads();
            res.key = kk; res.gt = above_c + (u32)s.sel_c; res.eq = (u32)s.sel_m;
        } else {
            // Consecutive candidates per thread so that the scan follows the sorted order.
            const u32 cper = (SEL_CAP + nt - 1) / nt;
            u64 wsum = 0ull;
            for (u32 q = 0; q < cper; ++q) {
                const u32 j = tid * cper + q;
                if (j < n) wsum += wfix(kval(s.cand[j]), m);
            }
            u64 tot;
            u64 e = above_m + block_excl_scan_u64(wsum, s, &tot);
            if (tid == 0) s.sel = 0xffffffffu;
            __syncthreads();
            for (u32 q = 0; q < cper; ++q) {
                const u32 j = tid * cper + q;
                if (j >= n) break;
                if ((double)e < target) atomicMin(&s.sel, s.cand[j]);
                e += wfix(kval(s.cand[j]), m);
            }
            __syncthreads();
            res.key = s.sel;
        }
        break;
    }
    __syncthreads();
    return res;
}
