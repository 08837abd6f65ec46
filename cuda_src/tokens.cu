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

// The same inside a decode graph, whose launch arguments are fixed at capture: the source is named
// by the graph's input buffer, which the host fills each step. feed (int64): [0] the address of
// the sampler's ids, [1] their stride in ints, [2 + i] the row of graph row i there, or -1 for a
// row whose id the host uploaded.
extern "C" __global__ void feed_tokens(const long long* __restrict__ feed, int n, long long* __restrict__ ids) {
    pdl_wait();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const long long r = feed[2 + i];
    if (r >= 0) ids[i] = reinterpret_cast<const int*>(feed[0])[r * feed[1]];
}
