// Writes k, v of the new tokens (float32 [N, Hkv, D], each token's Hkv*D values contiguous, token
// strides given) into the paged cache [num_blocks * block_size, Hkv, D] at slot_mapping[t].
// A negative slot skips the token (padding).
#include "common.cuh"

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
