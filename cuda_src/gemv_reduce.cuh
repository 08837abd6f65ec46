// End of a GEMV block (1 to 4 warps, R rows x NB batch columns per block): sum the
// per-thread partials across the warps through shared memory, then inside warp 0 with
// shuffles; lane r*NB+n writes y[n, row0+r] (+ bias).  gemv_reduce_lanes_store: the same for
// groups of L lanes that each own R rows (shuffles only).  s: a factor on every sum before the
// bias (xnorm_scale; 1 leaves the sums as they are).
#pragma once

namespace pq {

constexpr int GEMV_THREADS = 128;

// The RMSNorm scale of batch-1 activations whose int8 blocks a GEMV with a norm epilogue wrote
// without it (gemv_kquant_norm): part holds K / 32 sums of squares, each with 32 * eps added, so
// s = rsqrt(sum / K) = rsqrt(mean(h^2) + eps); the block scales d are linear in s, so the GEMV's
// sums take it at the end. part == nullptr: 1. Every lane of the warp calls it and gets the same
// bits (a fixed order of loads, then a butterfly).
__device__ __forceinline__ float xnorm_rest(const float* __restrict__ part, int K, float t, int i0) {
#pragma unroll 4
    for (int i = (threadIdx.x & 31) + i0; i < K / 32; i += 32) t += __ldcg(part + i);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    return rsqrtf(t / (float)K);
}

__device__ __forceinline__ float xnorm_scale(const float* __restrict__ part, int K) {
    return part == nullptr ? 1.0f : xnorm_rest(part, K, 0.0f, 0);
}

// The same with a lane's first XN_EARLY sums loaded by xnorm_load right after pdl_wait, so that their
// round trip overlaps the GEMV's loop instead of following it (gemv_gguf: H200 Q8_0 8B decode graph
// 2,480-2,490 us against 2,500-2,503; the K-quant GEMVs lost, 2,048 against 2,017 on Q4_K_M, so they
// load them at the end).
constexpr int XN_EARLY = 4;

__device__ __forceinline__ void xnorm_load(const float* __restrict__ part, int K, float (&v)[XN_EARLY]) {
#pragma unroll
    for (int j = 0; j < XN_EARLY; ++j) {
        const int i = (threadIdx.x & 31) + 32 * j;
        v[j] = part != nullptr && i < K / 32 ? __ldcg(part + i) : 0.0f;
    }
}

__device__ __forceinline__ float xnorm_scale(const float* __restrict__ part, int K, const float (&v)[XN_EARLY]) {
    if (part == nullptr) return 1.0f;
    float t = 0.0f;
#pragma unroll
    for (int j = 0; j < XN_EARLY; ++j) t += v[j];
    return xnorm_rest(part, K, t, 32 * XN_EARLY);
}

// red: (GEMV_THREADS / 32 - 1) * R * NB * 32 floats of shared memory, free for this call
template <int NB, int R>
__device__ __forceinline__ void gemv_reduce_store_to(float (&acc)[R][NB], int row0, int rows,
                                                     const float* __restrict__ bias, float* __restrict__ y,
                                                     float* red, float s = 1.0f) {
    static_assert(R * NB <= 32, "one output per lane of warp 0");
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    if (warp > 0) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int n = 0; n < NB; ++n) red[((warp - 1) * R * NB + r * NB + n) * 32 + lane] = acc[r][n];
    }
    __syncthreads();
    if (warp > 0) return;
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int n = 0; n < NB; ++n) {
            float v = acc[r][n];
#pragma unroll
            for (int w = 0; w < GEMV_THREADS / 32 - 1; ++w)
                if (w < nwarps - 1) v += red[(w * R * NB + r * NB + n) * 32 + lane];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            const int row = row0 + r;
            v *= s;
            if (lane == r * NB + n && row < rows) y[(long long)n * rows + row] = bias ? v + bias[row] : v;
        }
    }
}

template <int NB, int R>
__device__ __forceinline__ void gemv_reduce_store(float (&acc)[R][NB], int row0, int rows,
                                                  const float* __restrict__ bias, float* __restrict__ y,
                                                  float s = 1.0f) {
    __shared__ float red[(GEMV_THREADS / 32 - 1) * R * NB * 32];
    gemv_reduce_store_to<NB, R>(acc, row0, rows, bias, y, red, s);
}

// L (power of two, <= 32) consecutive lanes own rows row0 .. row0+R-1; lane l of the group
// (l = threadIdx.x % L) writes the outputs i = r*NB+n with i % L == l.  Every lane of the
// warp must call this (the shuffles span the warp; groups never mix since offsets are < L).
template <int NB, int R, int L>
__device__ __forceinline__ void gemv_reduce_lanes_store(float (&acc)[R][NB], int row0, int rows,
                                                        const float* __restrict__ bias, float* __restrict__ y,
                                                        float s = 1.0f) {
    const int l = threadIdx.x & (L - 1);
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int n = 0; n < NB; ++n) {
            float v = acc[r][n];
#pragma unroll
            for (int o = L / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            v *= s;
            const int row = row0 + r;
            if (l == (r * NB + n) % L && row < rows) y[(long long)n * rows + row] = bias ? v + bias[row] : v;
        }
    }
}

}  // namespace pq
