// Async scheduling: a step is launched before the host has seen the tokens sampled by the step
// before it, so those rows of the input ids come from the device: dst[dst_rows[i]] =
// src[src_rows[i] * src_stride] (src: the sampler's int32 ids, a column of its result rows).
#include "common.cuh"

extern "C" __global__ void scatter_tokens(const int* __restrict__ src, long long src_stride,
                                          const int* __restrict__ rows, int n, long long* __restrict__ dst) {
    pdl_wait();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;   // rows: [2, n], dst rows then src rows
    if (i < n) dst[rows[i]] = src[(long long)rows[n + i] * src_stride];
}
