// RoPE on q and k plus the paged KV store in one launch (rope.cu and kv_store.cu do the same
// work in three): for token t, the q heads are rotated into q_out [N, Hq, D] (contiguous), the k
// heads are rotated and written with v to the fp16 cache [blocks * block_size, Hkv, D] at
// slot_mapping[t] (a negative slot stores nothing; q is still rotated). q, k, v are float32
// rows of heads (each token's heads contiguous, token strides given), e.g. column views of one
// fused QKV projection output. The token's rot_half sin/cos pairs are computed once.
// positions: int32/int64 [N]; inv_freq: float32 [rot_half], rot_half <= ROPE_MAX_HALF.
// The _i8 / _e4m3 / _k8v4 kernels store codes with their parameters per row (kv_codes.cuh) instead:
// a warp rotates (K) and quantizes each of the token's K and V rows.
#include "common.cuh"
#include "kv_codes.cuh"
#include "rope_prims.cuh"

#define ROPE_MAX_HALF 128

// Pair i of the head row xh, rotated when i < rot_half: its dims (ia, ib) and values (a, b)
__device__ __forceinline__ void rope_pair(const float* xh, int i, int rot_half, bool interleaved,
                                          const float (&cs)[2][ROPE_MAX_HALF], int& ia, int& ib, float& a, float& b) {
    rope_pair_index(i, rot_half, interleaved, ia, ib);
    a = xh[ia];
    b = xh[ib];
    if (i < rot_half) rope_rotate(a, b, cs[0][i], cs[1][i]);
}

// The token's angles into cs (the whole block calls it); its position
template <typename P>
__device__ __forceinline__ void rope_angles(const P* __restrict__ positions, const float* __restrict__ inv_freq,
                                            int tok, int rot_half, float (&cs)[2][ROPE_MAX_HALF]) {
    const float pos = (float)load_index(positions, tok);
    for (int i = threadIdx.x; i < rot_half; i += blockDim.x) sincosf(pos * inv_freq[i], &cs[1][i], &cs[0][i]);
    __syncthreads();
}

template <typename P, typename S, typename T, bool INTERLEAVED>
__device__ __forceinline__ void rope_store_kv_body(const float* __restrict__ q, i64 q_stride,
                                                   const float* __restrict__ k, i64 k_stride,
                                                   const float* __restrict__ v, i64 v_stride,
                                                   const P* __restrict__ positions,
                                                   const float* __restrict__ inv_freq,
                                                   const S* __restrict__ slot_mapping, float* __restrict__ q_out,
                                                   T* __restrict__ k_cache, T* __restrict__ v_cache, int n_tok,
                                                   int n_q_heads, int n_kv_heads, int head_dim, int rot_half) {
    __shared__ float cs[2][ROPE_MAX_HALF];
    const int tok = blockIdx.x;               // blockIdx.y: this block's share of the token's items
    if (tok >= n_tok) return;
    rope_angles(positions, inv_freq, tok, rot_half, cs);
    const i64 slot = load_index(slot_mapping, tok);
    const int half_dim = head_dim >> 1;
    const int nq = n_q_heads * half_dim, nk = n_kv_heads * half_dim;
    const float* qt = q + (i64)tok * q_stride;
    const float* kt = k + (i64)tok * k_stride;
    const float* vt = v + (i64)tok * v_stride;
    float* qo = q_out + (i64)tok * n_q_heads * head_dim;
    T* kc = k_cache + slot * n_kv_heads * head_dim;
    T* vc = v_cache + slot * n_kv_heads * head_dim;
    // pairs of q, then pairs of k (stored only for slot >= 0), then v elements
    const int total = nq + (slot >= 0 ? nk + n_kv_heads * head_dim : 0);
    for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < total; j += blockDim.x * gridDim.y) {
        if (j < nq + nk) {
            const bool is_q = j < nq;
            const int jj = is_q ? j : j - nq;
            const int h = jj / half_dim, i = jj - h * half_dim;
            int ia, ib;
            float a, b;
            rope_pair((is_q ? qt : kt) + (i64)h * head_dim, i, rot_half, INTERLEAVED, cs, ia, ib, a, b);
            if (is_q) {
                qo[(i64)h * head_dim + ia] = a;
                qo[(i64)h * head_dim + ib] = b;
            } else {
                kc[(i64)h * head_dim + ia] = KvType<T>::store(a);
                kc[(i64)h * head_dim + ib] = KvType<T>::store(b);
            }
        } else {
            const int e = j - nq - nk;
            vc[e] = KvType<T>::store(vt[e]);
        }
    }
}

// grid.x = N tokens, grid.y = blocks per token (a token's items spread over them: one item per
// thread instead of a 28-step dependent loop at batch 1), any blockDim.x.
#define ROPE_STORE_KERNEL(NAME, P, S, IL)                                                              \
    extern "C" __global__ void NAME(const float* __restrict__ q, i64 q_stride, const float* __restrict__ k, \
                                    i64 k_stride, const float* __restrict__ v, i64 v_stride,          \
                                    const P* __restrict__ positions, const float* __restrict__ inv_freq, \
                                    const S* __restrict__ slot_mapping, float* __restrict__ q_out,    \
                                    __half* __restrict__ k_cache, __half* __restrict__ v_cache,       \
                                    int n_tok, int n_q_heads, int n_kv_heads, int head_dim, int rot_half) { \
        pdl_wait();                                                                                         \
        rope_store_kv_body<P, S, __half, IL>(q, q_stride, k, k_stride, v, v_stride, positions, inv_freq, \
                                             slot_mapping, q_out, k_cache, v_cache, n_tok, n_q_heads,  \
                                             n_kv_heads, head_dim, rot_half);                          \
    }

ROPE_STORE_KERNEL(rope_store_kv_halves_f16_pos32_slot32, int, int, false)
ROPE_STORE_KERNEL(rope_store_kv_halves_f16_pos32_slot64, int, i64, false)
ROPE_STORE_KERNEL(rope_store_kv_halves_f16_pos64_slot32, i64, int, false)
ROPE_STORE_KERNEL(rope_store_kv_halves_f16_pos64_slot64, i64, i64, false)
ROPE_STORE_KERNEL(rope_store_kv_interleaved_f16_pos32_slot32, int, int, true)
ROPE_STORE_KERNEL(rope_store_kv_interleaved_f16_pos32_slot64, int, i64, true)
ROPE_STORE_KERNEL(rope_store_kv_interleaved_f16_pos64_slot32, i64, int, true)
ROPE_STORE_KERNEL(rope_store_kv_interleaved_f16_pos64_slot64, i64, i64, true)

// The quantized caches: q pairs spread over the token's threads as above; then warp w of the
// token's warps (over its grid.y blocks) takes rows w, w + warps, ... of its K heads (8-bit,
// rotated, pairs lane + 32p) and V heads (store_row_quant). C, CV: the K and V elements.
template <typename P, typename S, typename C, typename CV, bool INTERLEAVED>
__device__ __forceinline__ void rope_store_kv_quant_body(
    const float* __restrict__ q, i64 q_stride, const float* __restrict__ k, i64 k_stride, const float* __restrict__ v,
    i64 v_stride, const P* __restrict__ positions, const float* __restrict__ inv_freq, const S* __restrict__ slot_mapping,
    float* __restrict__ q_out, C* __restrict__ k_codes, float* __restrict__ k_scales, CV* __restrict__ v_codes,
    float* __restrict__ v_scales, int n_tok, int n_q_heads, int n_kv_heads, int head_dim, int rot_half) {
    __shared__ float cs[2][ROPE_MAX_HALF];
    const int tok = blockIdx.x;
    if (tok >= n_tok) return;
    rope_angles(positions, inv_freq, tok, rot_half, cs);
    const int half_dim = head_dim >> 1, nq = n_q_heads * half_dim;
    const float* qt = q + (i64)tok * q_stride;
    float* qo = q_out + (i64)tok * n_q_heads * head_dim;
    for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < nq; j += blockDim.x * gridDim.y) {
        const int h = j / half_dim;
        int ia, ib;
        float a, b;
        rope_pair(qt + (i64)h * head_dim, j - h * half_dim, rot_half, INTERLEAVED, cs, ia, ib, a, b);
        qo[(i64)h * head_dim + ia] = a;
        qo[(i64)h * head_dim + ib] = b;
    }
    const i64 slot = load_index(slot_mapping, tok);
    if (slot < 0) return;
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int r = blockIdx.y * warps + (threadIdx.x >> 5); r < 2 * n_kv_heads; r += warps * gridDim.y) {
        const int h = r % n_kv_heads;
        const i64 row = slot * n_kv_heads + h;
        if (r >= n_kv_heads) {
            store_row_quant<CV>(v + (i64)tok * v_stride + (i64)h * head_dim, v_codes, v_scales, row, head_dim, lane);
            continue;
        }
        int ia[4], ib[4];                             // head_dim <= 2 * ROPE_MAX_HALF: 4 pairs a lane
        float a[4], b[4], amax = 0.0f;
#pragma unroll
        for (int p = 0; p < 4; ++p) {
            const int i = lane + 32 * p;
            a[p] = b[p] = 0.0f;
            if (i < half_dim)
                rope_pair(k + (i64)tok * k_stride + (i64)h * head_dim, i, rot_half, INTERLEAVED, cs, ia[p], ib[p],
                          a[p], b[p]);
            amax = fmaxf(amax, fmaxf(fabsf(a[p]), fabsf(b[p])));
        }
        const float inv = kv_warp_row_scale<C>(amax, k_scales + row, lane == 0);
        C* kc = k_codes + row * head_dim;
#pragma unroll
        for (int p = 0; p < 4; ++p) {
            if (lane + 32 * p < half_dim) {
                kc[ia[p]] = KvCode<C>::encode(a[p] * inv);
                kc[ib[p]] = KvCode<C>::encode(b[p] * inv);
            }
        }
    }
}

#define ROPE_STORE_QUANT_KERNEL(NAME, P, S, C, CV, IL)                                                 \
    extern "C" __global__ void NAME(const float* __restrict__ q, i64 q_stride, const float* __restrict__ k, \
                                    i64 k_stride, const float* __restrict__ v, i64 v_stride,          \
                                    const P* __restrict__ positions, const float* __restrict__ inv_freq, \
                                    const S* __restrict__ slot_mapping, float* __restrict__ q_out,    \
                                    C* __restrict__ k_codes, float* __restrict__ k_scales,            \
                                    CV* __restrict__ v_codes, float* __restrict__ v_scales, int n_tok, \
                                    int n_q_heads, int n_kv_heads, int head_dim, int rot_half) {      \
        pdl_wait();                                                                                     \
        rope_store_kv_quant_body<P, S, C, CV, IL>(q, q_stride, k, k_stride, v, v_stride, positions, inv_freq, \
                                              slot_mapping, q_out, k_codes, k_scales, v_codes, v_scales, \
                                              n_tok, n_q_heads, n_kv_heads, head_dim, rot_half);      \
    }
#define ROPE_STORE_QUANT_KERNELS(KV, C, CV)                                                                  \
    ROPE_STORE_QUANT_KERNEL(rope_store_kv_halves_##KV##_pos32_slot32, int, int, C, CV, false)                \
    ROPE_STORE_QUANT_KERNEL(rope_store_kv_halves_##KV##_pos32_slot64, int, i64, C, CV, false)                \
    ROPE_STORE_QUANT_KERNEL(rope_store_kv_halves_##KV##_pos64_slot32, i64, int, C, CV, false)                \
    ROPE_STORE_QUANT_KERNEL(rope_store_kv_halves_##KV##_pos64_slot64, i64, i64, C, CV, false)                \
    ROPE_STORE_QUANT_KERNEL(rope_store_kv_interleaved_##KV##_pos32_slot32, int, int, C, CV, true)            \
    ROPE_STORE_QUANT_KERNEL(rope_store_kv_interleaved_##KV##_pos32_slot64, int, i64, C, CV, true)            \
    ROPE_STORE_QUANT_KERNEL(rope_store_kv_interleaved_##KV##_pos64_slot32, i64, int, C, CV, true)            \
    ROPE_STORE_QUANT_KERNEL(rope_store_kv_interleaved_##KV##_pos64_slot64, i64, i64, C, CV, true)
ROPE_STORE_QUANT_KERNELS(i8, signed char, signed char)
ROPE_STORE_QUANT_KERNELS(e4m3, u8, u8)
ROPE_STORE_QUANT_KERNELS(k8v4, signed char, nib2)
