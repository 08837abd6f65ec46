// NVFP4 weights kept as their codes: W uint8 [rows, K / 2] of E2M1 codes, each 4-byte word's 8 codes
// laid out by nvfp4_relaid_codes (weight_cuda.py; minifloat.cuh's e2m1x8_to_h2x4 reads them), times
// S uint8 [rows, K / 16] of E4M3 codes, a scale per row and 16 columns, times RS float32 [rows], the
// checkpoint's weight_scale_2 of the row's tensor times 256 (the scales are decoded as their values
// times 2^-8).
//
// gemv_nvfp4_mma<NT, U>: y[n, r] = sum_k x[n, k] W[r, k] S[r, k / 16] RS[r] (+ bias[r]) for batch
// nb <= 8 NT on tensor cores (sm_80+), laid out as gemv_fp8.cu: a block of F4_WARPS warps on 16 rows,
// each warp a strided share of the 64-wide chunks of K, U chunks' loads in flight together (a chunk is
// a quarter of the bytes of a 16-bit weight's); lane (g, t) reads the 16 codes of rows g and g + 8 at
// k = 64c + 16t, one scale group, decodes them to fp16 times that scale (exact), and the activations
// of batch rows 8j + g at the same k. The products accumulate in the mma's fp32 and are multiplied by
// RS at the end.  x is rounded to fp16 (saturated at +-65504).  Needs K % 64 == 0.  Grid: ceil(rows / 16).
// dequant_nvfp4<T>: rows of W as T (fp16 for the cuBLAS GEMM path's weight tile, float for get_rows).
// relay_nvfp4_codes: the upload's re-layout, on the device.
#include "minifloat.cuh"
#include "mma_tiles.cuh"

#define F4_WARPS 8

template <int NT, int U>
__global__ void __launch_bounds__(F4_WARPS * 32, 2)
gemv_nvfp4_mma(const u8* __restrict__ W, const u8* __restrict__ S, const float* __restrict__ RS, int rows, int K,
               const float* __restrict__ x, int nb, const float* __restrict__ bias, float* __restrict__ y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    __shared__ float red[F4_WARPS - 1][4 * NT][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 16, ra = min(row0 + g, rows - 1), rb = min(row0 + g + 8, rows - 1);
    const int groups = K >> 4;
    const uint2* wa = reinterpret_cast<const uint2*>(W + (i64)ra * (K >> 1)) + t;
    const uint2* wb = reinterpret_cast<const uint2*>(W + (i64)rb * (K >> 1)) + t;
    const u8* sa = S + (i64)ra * groups + t;
    const u8* sb = S + (i64)rb * groups + t;
    prefetch_l2(W + (i64)row0 * (K >> 1), (i64)(K >> 1) * (min(rows, row0 + 16) - row0));
    pdl_wait();
    const int nchunks = K >> 6;
    float c[NT][1][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) c[j][0][i] = 0.0f;
    for (int c0 = warp; c0 < nchunks; c0 += F4_WARPS * U) {
        uint2 a[U][2];
        u32 s[U][2];
#pragma unroll
        for (int u = 0; u < U; ++u) {   // unconditional loads (past the end: the last chunk, unused)
            const int ch = min(c0 + u * F4_WARPS, nchunks - 1);
            a[u][0] = __ldcs(wa + 4 * ch);
            a[u][1] = __ldcs(wb + 4 * ch);
            s[u][0] = sa[4 * ch];
            s[u][1] = sb[4 * ch];
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int ch = c0 + u * F4_WARPS;
            if (ch >= nchunks) break;
            u32 ha[8], hb[8];
            e2m1x16_to_h2x8(a[u][0], s[u][0], ha);
            e2m1x16_to_h2x8(a[u][1], s[u][1], hb);
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const int n = 8 * j + g;
                const float4* xr = reinterpret_cast<const float4*>(x + (i64)min(n, nb - 1) * K + 64 * ch + 16 * t);
                const bool use = n < nb;
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const u32 af[4] = {ha[2 * q], hb[2 * q], ha[2 * q + 1], hb[2 * q + 1]};
                    const float4 v = xr[q];
                    mma_16816(c[j][0], af, use ? pack_f2h2_sat(v.x, v.y) : 0u, use ? pack_f2h2_sat(v.z, v.w) : 0u);
                }
            }
        }
    }
    mma_tiles_store<NT, 1, 1, F4_WARPS>(c, red, warp, 0, warp, lane, row0, rows, nb, RS, bias, y);
#else
    pdl_wait();
#endif
}

__device__ __forceinline__ void store16(__half* out, const u32 (&h)[8], float rs) {
    u32 o[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) {
        const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&h[q]));
        o[q] = pack_f2h2(v.x * rs, v.y * rs);
    }
    reinterpret_cast<uint4*>(out)[0] = make_uint4(o[0], o[1], o[2], o[3]);
    reinterpret_cast<uint4*>(out)[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

__device__ __forceinline__ void store16(float* out, const u32 (&h)[8], float rs) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&h[2 * q]));
        const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&h[2 * q + 1]));
        reinterpret_cast<float4*>(out)[q] = make_float4(a.x * rs, a.y * rs, b.x * rs, b.y * rs);
    }
}

// out [nr, K] = rows ids[0 .. nr - 1] of W (ids null: rows r0 .. r0 + nr - 1) times their scales; a thread
// per scale group of 16 codes. Grid: (ceil(K / 16 / blockDim.x), up to nr).
template <typename T>
__global__ void dequant_nvfp4(const u8* __restrict__ W, const u8* __restrict__ S, const float* __restrict__ RS,
                              int K, long long r0, const int* __restrict__ ids, int nr, T* __restrict__ out) {
    pdl_wait();
    const int groups = K >> 4, gi = blockIdx.x * blockDim.x + threadIdx.x;
    if (gi >= groups) return;
    for (int r = blockIdx.y; r < nr; r += gridDim.y) {
        const long long src = ids ? (long long)ids[r] : r0 + r;
        u32 h[8];
        e2m1x16_to_h2x8(*reinterpret_cast<const uint2*>(W + src * (K >> 1) + 8 * gi), S[src * groups + gi], h);
        store16(out + (long long)r * K + 16 * gi, h, RS[src]);
    }
}

// Checkpoint-order codes -> the layout gemv_nvfp4_mma reads (nvfp4_relaid_codes), in place: nibble j of
// each word moves to nibble 0, 4, 1, 5, 2, 6, 3, 7 for j = 0..7
extern "C" __global__ void relay_nvfp4_codes(u32* __restrict__ w, long long n) {
    pdl_wait();
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const u32 v = w[i];
        w[i] = (v & 0xF000000Fu) | ((v & 0xF0u) << 12) | ((v >> 4) & 0xF0u) | ((v & 0xF000u) << 8)
             | ((v >> 8) & 0xF00u) | ((v & 0xF00000u) << 4) | ((v >> 12) & 0xF000u);
    }
}

#ifndef __CUDACC_RTC__
#define GEMV_NVFP4_MMA(NT, U) template __global__ void gemv_nvfp4_mma<NT, U>( \
    const u8*, const u8*, const float*, int, int, const float*, int, const float*, float*);
#define DEQUANT_NVFP4(T) template __global__ void dequant_nvfp4<T>( \
    const u8*, const u8*, const float*, int, long long, const int*, int, T*);
GEMV_NVFP4_MMA(1, 4)
GEMV_NVFP4_MMA(1, 8)
GEMV_NVFP4_MMA(2, 4)
GEMV_NVFP4_MMA(2, 8)
DEQUANT_NVFP4(__half)
DEQUANT_NVFP4(float)
#endif
