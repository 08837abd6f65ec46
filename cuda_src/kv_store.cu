// Writes k, v of the new tokens (float32 [N, Hkv, D], each token's Hkv*D values contiguous, token
// strides given) into the paged cache [num_blocks * block_size, Hkv, D] at slot_mapping[t].
// A negative slot skips the token (padding). The _i8 / _e4m3 / _k8v4 kernels write codes and their
// float32 parameters per (token, KV head) row instead (kv_codes.cuh): one warp quantizes a row.
#include "common.cuh"
#include "kv_codes.cuh"

template <typename T, typename S>
__device__ __forceinline__ void store_kv_body(const float* __restrict__ k, const float* __restrict__ v,
                                              T* __restrict__ k_cache, T* __restrict__ v_cache,
                                              const S* __restrict__ slot_mapping, int n_tok, int row_elems,
                                              i64 k_stride, i64 v_stride) {
    const int tok = blockIdx.x;
    if (tok >= n_tok) return;
    const i64 slot = load_index(slot_mapping, tok);
    if (slot < 0) return;
    const float* kt = k + (i64)tok * k_stride;
    const float* vt = v + (i64)tok * v_stride;
    T* kc = k_cache + slot * row_elems;
    T* vc = v_cache + slot * row_elems;
    for (int e = threadIdx.x; e < row_elems; e += blockDim.x) {
        kc[e] = KvType<T>::store(kt[e]);
        vc[e] = KvType<T>::store(vt[e]);
    }
}

// grid.x = N tokens, blockDim.x = 128.
#define STORE_KV_KERNEL(NAME, T, S)                                                                 \
    extern "C" __global__ void NAME(const float* __restrict__ k, const float* __restrict__ v,      \
                                    T* __restrict__ k_cache, T* __restrict__ v_cache,              \
                                    const S* __restrict__ slot_mapping, int n_tok, int row_elems,   \
                                    i64 k_stride, i64 v_stride) {                                  \
        pdl_wait();                                                                                \
        store_kv_body<T, S>(k, v, k_cache, v_cache, slot_mapping, n_tok, row_elems, k_stride, v_stride); \
    }

STORE_KV_KERNEL(store_kv_f16_slot32, __half, int)
STORE_KV_KERNEL(store_kv_f16_slot64, __half, i64)

// grid.x = N tokens, blockDim.x a multiple of 32: warp w quantizes rows w, w + warps, ... of the
// token's K and V heads. k_codes / v_codes [blocks * block_size * Hkv, D / PER_ELEM], their
// parameters [... * Hkv, P] (C, CV: the K and V elements).
#define STORE_KV_QUANT_KERNEL(NAME, C, CV, S)                                                      \
    extern "C" __global__ void NAME(const float* __restrict__ k, const float* __restrict__ v,      \
                                    C* __restrict__ k_codes, float* __restrict__ k_scales,         \
                                    CV* __restrict__ v_codes, float* __restrict__ v_scales,        \
                                    const S* __restrict__ slot_mapping, int n_tok, int num_kv_heads, \
                                    int head_dim, i64 k_stride, i64 v_stride) {                    \
        pdl_wait();                                                                                \
        const int tok = blockIdx.x, lane = threadIdx.x & 31;                                       \
        if (tok >= n_tok) return;                                                                  \
        const i64 slot = load_index(slot_mapping, tok);                                            \
        if (slot < 0) return;                                                                      \
        for (int r = threadIdx.x >> 5; r < 2 * num_kv_heads; r += blockDim.x >> 5) {               \
            const bool is_v = r >= num_kv_heads;                                                   \
            const int h = is_v ? r - num_kv_heads : r;                                             \
            const i64 row = slot * num_kv_heads + h;                                               \
            if (is_v)                                                                              \
                store_row_quant<CV>(v + tok * v_stride + (i64)h * head_dim, v_codes, v_scales, row, head_dim, lane); \
            else                                                                                   \
                store_row_quant<C>(k + tok * k_stride + (i64)h * head_dim, k_codes, k_scales, row, head_dim, lane); \
        }                                                                                          \
    }

STORE_KV_QUANT_KERNEL(store_kv_i8_slot32, signed char, signed char, int)
STORE_KV_QUANT_KERNEL(store_kv_i8_slot64, signed char, signed char, i64)
STORE_KV_QUANT_KERNEL(store_kv_e4m3_slot32, u8, u8, int)
STORE_KV_QUANT_KERNEL(store_kv_e4m3_slot64, u8, u8, i64)
STORE_KV_QUANT_KERNEL(store_kv_k8v4_slot32, signed char, nib2, int)
STORE_KV_QUANT_KERNEL(store_kv_k8v4_slot64, signed char, nib2, i64)
