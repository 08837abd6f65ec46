// RMSNorm over the last axis (float32 activations, float32 weight), and the fused
// residual-add + RMSNorm. Per-head norms (Qwen3 q/k norm) are rows of length head_dim.
#include "common.cuh"

// One warp per row, for short rows (dim <= 256: per-head norms, tiny models).
// blockDim.x = 32 * rows_per_block; grid.x = ceil(rows / rows_per_block).
extern "C" __global__ void rms_norm_rows_f32(const float* __restrict__ x, const float* __restrict__ w,
                                             float* __restrict__ out, int rows, int dim, float eps) {
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float* xr = x + (i64)row * dim;
    float* orow = out + (i64)row * dim;
    float ss = 0.0f;
    for (int d = lane; d < dim; d += 32) ss += xr[d] * xr[d];
    const float r = rsqrtf(warp_sum(ss) / dim + eps);
    for (int d = lane; d < dim; d += 32) orow[d] = xr[d] * r * w[d];
}

// One block per row (blockDim.x a multiple of 32); grid.x = rows.
extern "C" __global__ void rms_norm_f32(const float* __restrict__ x, const float* __restrict__ w,
                                        float* __restrict__ out, int dim, float eps) {
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
