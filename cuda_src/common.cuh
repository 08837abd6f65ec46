// Shared helpers for pocketcupy kernels. Compiles under nvcc and NVRTC (CuPy RawModule):
// no host headers; integer types have our own names so they never clash with <cstdint>.
#pragma once

#include <cuda_fp16.h>

#include "pdl.cuh"

typedef long long i64;
typedef unsigned long long u64;
typedef int i32;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

#define PC_WARP 32
#define PC_FULL_MASK 0xffffffffu

__device__ __forceinline__ float pc_neg_inf() { return __int_as_float(0xff800000); }

// atomicAdd with acquire-release semantics at GPU scope (sm_70+); returns the old value.
__device__ __forceinline__ int atomic_add_acq_rel_gpu(int* p, int v) {
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(PC_FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(PC_FULL_MASK, v, o));
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. `scratch` holds 32 floats; the call synchronises, so scratch may be reused after it.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();                         // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

// KV cache element types: load as float, store from float. FP8/INT8 KV will add specialisations.
template <typename T> struct KvType;
template <> struct KvType<__half> {
    static constexpr int PER16 = 8;    // elements per 16 bytes
    static __device__ __forceinline__ float load(__half x) { return __half2float(x); }
    static __device__ __forceinline__ __half store(float x) { return __float2half_rn(x); }
    static __device__ __forceinline__ void unpack16(const uint4& r, float* f) {
        const u32 w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            f[2 * i] = __half2float(__ushort_as_half((u16)(w[i] & 0xffffu)));
            f[2 * i + 1] = __half2float(__ushort_as_half((u16)(w[i] >> 16)));
        }
    }
};

// Paged KV cache: the slot of position `key` of a sequence whose block table is `table`.
__device__ __forceinline__ i64 cache_slot(const int* __restrict__ table, int key, int block_size) {
    return (i64)table[key / block_size] * block_size + key % block_size;
}

// Reads an index array element stored as int32 or int64.
template <typename I> __device__ __forceinline__ i64 load_index(const I* p, i64 i) { return (i64)p[i]; }

// 16-byte global -> shared copies: cp.async on sm_80+ (wait with cp_async_wait<N>: all but the
// N most recent committed groups have landed), a plain copy before that.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const u32 s = (u32)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
#else
    *reinterpret_cast<uint4*>(smem) = *reinterpret_cast<const uint4*>(gmem);
#endif
}

// N-byte (4, 8 or 16) global -> shared copy by cp.async that writes zeros instead where !valid
// (gmem must still be a mapped address); sm_80+ only.
template <int N> __device__ __forceinline__ void cp_async_zfill(void* smem, const void* gmem, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const u32 s = (u32)__cvta_generic_to_shared(smem);
    if constexpr (N == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(s), "l"(gmem), "n"(N), "r"(valid ? N : 0));
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int N> __device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}
