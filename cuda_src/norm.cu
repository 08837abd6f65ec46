// RMSNorm over the last axis (float32 activations, float32 weight), and the fused
// residual-add + RMSNorm. Per-head norms (Qwen3 q/k norm) are rows of length head_dim.
#include "common.cuh"
#include "gguf_prims.cuh"
#include "norm_row.cuh"
#include "q8_act.cuh"

// One block per row (blockDim.x a multiple of 32); grid.x = rows.
extern "C" __global__ void rms_norm_f32(const float* __restrict__ x, const float* __restrict__ w,
                                        float* __restrict__ out, int dim, float eps) {
    pdl_wait();
    __shared__ float scratch[32];
    const float* xr = x + (i64)blockIdx.x * dim;
    float* orow = out + (i64)blockIdx.x * dim;
    float ss = 0.0f;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) ss += xr[d] * xr[d];
    const float r = rsqrtf(block_sum(ss, scratch) / dim + eps);
    for (int d = threadIdx.x; d < dim; d += blockDim.x) orow[d] = xr[d] * r * w[d];
}

// res_out = x + res; out = rms_norm(res_out) * w. One block per row. res_out may alias res
// (in-place residual update): each element is read and written by the same thread.
extern "C" __global__ void add_rms_norm_f32(const float* __restrict__ x, const float* res,
                                            const float* __restrict__ w, float* __restrict__ out,
                                            float* res_out, int dim, float eps) {
    pdl_wait();
    __shared__ float scratch[32];
    const i64 base = (i64)blockIdx.x * dim;
    float ss = 0.0f;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
        const float h = x[base + d] + res[base + d];
        res_out[base + d] = h;
        ss += h * h;
    }
    const float r = rsqrtf(block_sum(ss, scratch) / dim + eps);
    for (int d = threadIdx.x; d < dim; d += blockDim.x) out[base + d] = res_out[base + d] * r * w[d];
}

// --- one warp per row, the row in registers (dim <= 32 * E): one read of x (and the residual),
// one warp reduction, no block barrier.  For the narrow rows of small models (576 wide: ~2 us
// instead of a block of 160 threads with two barriers).  blockDim.x = 32 * rows per block.
template <int E, bool ADD>
__device__ __forceinline__ void rms_norm_warp_body(const float* __restrict__ x, const float* res,
                                                   const float* __restrict__ w, float* __restrict__ out,
                                                   float* res_out, int rows, int dim, float eps) {
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;                  // whole warps leave together
    const i64 base = (i64)row * dim;
    warp_norm_row<E, ADD>(x + base, ADD ? res + base : nullptr, w, out + base, ADD ? res_out + base : nullptr, dim,
                          eps);
}

// rms_norm_warp_f32_d<D>: rows of at most D values. add_rms_norm_warp_f32_d<D>: res_out = x + res,
// out = rms_norm(res_out) * w (res_out may alias res).
#define RMS_NORM_WARP(D)                                                                              \
    extern "C" __global__ void rms_norm_warp_f32_d##D(const float* __restrict__ x,                  \
                                                      const float* __restrict__ w,                  \
                                                      float* __restrict__ out, int rows, int dim,  \
                                                      float eps) {                                  \
        pdl_wait();                                                                                 \
        rms_norm_warp_body<D / 32, false>(x, nullptr, w, out, nullptr, rows, dim, eps);             \
    }                                                                                               \
    extern "C" __global__ void add_rms_norm_warp_f32_d##D(const float* __restrict__ x, const float* res, \
                                                          const float* __restrict__ w,              \
                                                          float* __restrict__ out, float* res_out,  \
                                                          int rows, int dim, float eps) {           \
        pdl_wait();                                                                                 \
        rms_norm_warp_body<D / 32, true>(x, res, w, out, res_out, rows, dim, eps);                 \
    }

RMS_NORM_WARP(128)
RMS_NORM_WARP(256)
RMS_NORM_WARP(512)
RMS_NORM_WARP(1024)

// --- a block per row, the row in registers as V float4 a thread (dim % 4 == 0, dim <= 4 * V * blockDim.x):
// every load of the row issued at once, one block reduction (the loop kernels above wait on one
// load per step: ~6 us for a 4096-wide row at batch 1).  blockDim.x: a multiple of 64 up to 1024
// (elementwise_cuda.norm_vec_launch).
// EXTRA: a second copy of the output for the linears that read it -- NORM_Q8: int8 blocks of 32
// (q8_act.cuh) into xq [rows * dim], xds [rows * dim / 32], for linears with int8 activations
// (dim % 32 == 0); NORM_F16 / NORM_BF16: 16-bit floats into x16 [rows * dim] (the GEMM path's
// cuBLAS input, rounded as cast_f32_f16 / cast_f32_bf16 in gemv.cu round); NORM_Q8K: int8 per 256
// values into xq [dim / 32, rows, 32], xd [rows * dim / 256], xb [rows * dim / 32] (quantize_q8k_x's
// layout, the K-quant tensor-core linears' input; dim % 256 == 0; one block per row).
enum { NORM_PLAIN = 0, NORM_Q8 = 1, NORM_F16 = 2, NORM_BF16 = 3, NORM_Q8K = 4 };

template <int V, int EXTRA>
__device__ __forceinline__ void rms_norm_vec_body(const float* __restrict__ x, const float* res,
                                                  const float* __restrict__ w, float* __restrict__ out,
                                                  float* res_out, int dim, float eps, signed char* xq = nullptr,
                                                  float4* xds = nullptr, u16* x16 = nullptr,
                                                  float* xd = nullptr, short* xb = nullptr) {
    __shared__ float scratch[32];
    const int n4 = dim >> 2;
    const i64 base = (i64)blockIdx.x * n4;
    const float4* x4 = (const float4*)x + base;
    float4 h[V], wv[V];
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < V; ++e) {
        const int i = threadIdx.x + e * blockDim.x;
        h[e] = wv[e] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < n4) {
            h[e] = x4[i];
            if (res) {
                const float4 r = ((const float4*)res)[base + i];
                h[e] = make_float4(h[e].x + r.x, h[e].y + r.y, h[e].z + r.z, h[e].w + r.w);
            }
            wv[e] = ((const float4*)w)[i];
        }
    }
#pragma unroll
    for (int e = 0; e < V; ++e) {
        const int i = threadIdx.x + e * blockDim.x;
        if (res && i < n4) ((float4*)res_out)[base + i] = h[e];
        ss += h[e].x * h[e].x + h[e].y * h[e].y + h[e].z * h[e].z + h[e].w * h[e].w;
    }
    const float r = rsqrtf(block_sum(ss, scratch) / dim + eps);
#pragma unroll
    for (int e = 0; e < V; ++e) {
        const int i = threadIdx.x + e * blockDim.x;
        const float4 o = make_float4(h[e].x * r * wv[e].x, h[e].y * r * wv[e].y, h[e].z * r * wv[e].z,
                                     h[e].w * r * wv[e].w);
        if (i < n4) ((float4*)out)[base + i] = o;
        if constexpr (EXTRA == NORM_Q8) q8_store4(q8_round4(o), base + i, i < n4, xq, xds);
        if constexpr (EXTRA == NORM_Q8K) q8k_store4(o, i, i < n4, scratch, xq, xd, xb, blockIdx.x, gridDim.x, n4);
        if constexpr (EXTRA == NORM_F16 || EXTRA == NORM_BF16) {
            if (i < n4) {
                const float f[4] = {o.x, o.y, o.z, o.w};
                u32 p[2];
#pragma unroll
                for (int k = 0; k < 2; ++k)
                    p[k] = EXTRA == NORM_F16 ? (u32)pq::f2h(f[2 * k]) | ((u32)pq::f2h(f[2 * k + 1]) << 16)
                                             : (u32)pq::f2bf(f[2 * k]) | ((u32)pq::f2bf(f[2 * k + 1]) << 16);
                ((uint2*)x16)[base + i] = make_uint2(p[0], p[1]);
            }
        }
    }
}

#define RMS_NORM_VEC(V)                                                                               \
    extern "C" __global__ void rms_norm_vec_f32_v##V(const float* __restrict__ x, const float* __restrict__ w, \
                                                     float* __restrict__ out, int dim, float eps) {  \
        pdl_wait();                                                                                  \
        rms_norm_vec_body<V, NORM_PLAIN>(x, nullptr, w, out, nullptr, dim, eps);                     \
    }                                                                                               \
    extern "C" __global__ void add_rms_norm_vec_f32_v##V(const float* __restrict__ x, const float* res, \
                                                         const float* __restrict__ w, float* __restrict__ out, \
                                                         float* res_out, int dim, float eps) {       \
        pdl_wait();                                                                                  \
        rms_norm_vec_body<V, NORM_PLAIN>(x, res, w, out, res_out, dim, eps);                         \
    }                                                                                               \
    extern "C" __global__ void add_rms_norm_q8_vec_f32_v##V(const float* __restrict__ x, const float* res, \
                                                            const float* __restrict__ w, float* __restrict__ out, \
                                                            float* res_out, int dim, float eps,     \
                                                            signed char* __restrict__ xq, float4* __restrict__ xds) { \
        pdl_wait();                                                                                                   \
        rms_norm_vec_body<V, NORM_Q8>(x, res, w, out, res_out, dim, eps, xq, xds);                   \
    }                                                                                               \
    extern "C" __global__ void add_rms_norm_q8k_vec_f32_v##V(const float* __restrict__ x, const float* res, \
                                                             const float* __restrict__ w, float* __restrict__ out, \
                                                             float* res_out, int dim, float eps,     \
                                                             signed char* __restrict__ xq, float* __restrict__ xd, \
                                                             short* __restrict__ xb) {                \
        pdl_wait();                                                                                  \
        rms_norm_vec_body<V, NORM_Q8K>(x, res, w, out, res_out, dim, eps, xq, nullptr, nullptr, xd, xb); \
    }                                                                                               \
    extern "C" __global__ void add_rms_norm_f16_vec_f32_v##V(const float* __restrict__ x, const float* res, \
                                                             const float* __restrict__ w, float* __restrict__ out, \
                                                             float* res_out, int dim, float eps, u16* __restrict__ x16) { \
        pdl_wait();                                                                                                       \
        rms_norm_vec_body<V, NORM_F16>(x, res, w, out, res_out, dim, eps, nullptr, nullptr, x16);    \
    }                                                                                               \
    extern "C" __global__ void add_rms_norm_bf16_vec_f32_v##V(const float* __restrict__ x, const float* res, \
                                                              const float* __restrict__ w, float* __restrict__ out, \
                                                              float* res_out, int dim, float eps, u16* __restrict__ x16) { \
        pdl_wait();                                                                                                        \
        rms_norm_vec_body<V, NORM_BF16>(x, res, w, out, res_out, dim, eps, nullptr, nullptr, x16);   \
    }

RMS_NORM_VEC(1)
RMS_NORM_VEC(2)
RMS_NORM_VEC(4)
RMS_NORM_VEC(8)
