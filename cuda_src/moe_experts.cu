// Routed experts over fp16 / bf16 weights without reading the routing on the host (so a decode step
// with experts can be captured in a CUDA graph): every (row, pick) pair p of a batch multiplies its
// row by its expert's weight, found through a device table of the experts' addresses; then each
// row's picks are summed with their weights. NumPy reference: NumpyOps.moe_experts.
#include "common.cuh"
#include "gguf_prims.cuh"

template <int WT> __device__ __forceinline__ float widen16(u32 v);
template <> __device__ __forceinline__ float widen16<0>(u32 v) { return pq::h2f((u16)v); }
template <> __device__ __forceinline__ float widen16<1>(u32 v) { return pq::bf2f((u16)v); }

// y[p, r] = sum_c W[r, c] x[p / x_div, c], W = the [rows, cols] 16-bit weight (WT 0 fp16, 1 bf16)
// at weights[ids[p]]. cols a multiple of 8, weight rows and x rows 16-byte aligned (x_stride a
// multiple of 4). grid (ceil(rows / warps), pairs), a warp a row, 8 columns a lane a step.
template <int WT>
__global__ void moe_pair_gemv16(const u64* __restrict__ weights, const int* __restrict__ ids,
                                const float* __restrict__ x, i64 x_stride, int x_div, float* __restrict__ y,
                                int rows, int cols) {
    pdl_wait();
    const int p = blockIdx.y, lane = threadIdx.x & 31;
    const int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;
    const u16* w = reinterpret_cast<const u16*>(weights[ids[p]]) + (i64)r * cols;
    const float* xr = x + (i64)(p / x_div) * x_stride;
    float acc = 0.0f;
    for (int c = lane * 8; c < cols; c += 256) {
        const uint4 wv = *reinterpret_cast<const uint4*>(w + c);
        const float4 x0 = *reinterpret_cast<const float4*>(xr + c), x1 = *reinterpret_cast<const float4*>(xr + c + 4);
        acc += widen16<WT>(wv.x & 0xffff) * x0.x + widen16<WT>(wv.x >> 16) * x0.y
             + widen16<WT>(wv.y & 0xffff) * x0.z + widen16<WT>(wv.y >> 16) * x0.w
             + widen16<WT>(wv.z & 0xffff) * x1.x + widen16<WT>(wv.z >> 16) * x1.y
             + widen16<WT>(wv.w & 0xffff) * x1.z + widen16<WT>(wv.w >> 16) * x1.w;
    }
    acc = warp_sum(acc);
    if (lane == 0) y[(i64)p * rows + r] = acc;
}

// out[n, c] = sum_j w[n, j] y[n k + j, c]: y [N k, C] the pairs' outputs, w [N, k]. grid (ceil(C /
// 256), N), block 256.
extern "C" __global__ void moe_combine_f32(const float* __restrict__ y, const float* __restrict__ w,
                                           float* __restrict__ out, int k, int C) {
    pdl_wait();
    const int n = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) acc += w[(i64)n * k + j] * y[((i64)n * k + j) * C + c];
    out[(i64)n * C + c] = acc;
}
