// Dense fp16 / bf16 GEMV for batch 1-8 with fp32 activations and output, and the fp32 ->
// fp16 / bf16 casts that feed the cuBLAS GEMM path.
//
// gemv_dense<WT, NB, R>: WT 0 fp16, 1 bf16; block of 32-128 threads (fewer for short rows)
// owns R rows, its threads stride over 8-value (16-byte) chunks of K; U chunks per row are loaded before any math
// so each thread keeps U*R 16-byte loads in flight.  Needs K % 8 == 0.  Grid: ceil(rows / R).
#include "gguf_prims.cuh"
#include "gemv_reduce.cuh"
#include "pdl.cuh"

using namespace pq;

// weights are read once: keep them out of L1, where the activations live
PQ_DEV uint4 ld_stream(const uint4* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

template <int WT>
PQ_DEV void unpack8(const uint4& w, float (&f)[8]) {
    const u32 v[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if constexpr (WT == 0) {
            f[2 * i] = h2f((u16)(v[i] & 0xffffu));
            f[2 * i + 1] = h2f((u16)(v[i] >> 16));
        } else {
            f[2 * i] = __uint_as_float(v[i] << 16);
            f[2 * i + 1] = __uint_as_float(v[i] & 0xffff0000u);
        }
    }
}

template <int WT, int NB, int R>
__global__ void __launch_bounds__(GEMV_THREADS)
gemv_dense(const u16* __restrict__ W, int rows, int K, const float* __restrict__ x,
           const float* __restrict__ bias, float* __restrict__ y) {
    constexpr int U = R >= 4 ? 2 : 4;
    const int row0 = blockIdx.x * R;
    const uint4* wr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wr[r] = (const uint4*)(W + (long long)min(row0 + r, rows - 1) * K);
    prefetch_l2(W + (long long)row0 * K, 2ll * K * (min(rows, row0 + R) - row0));
    pdl_wait();

    float acc[R][NB];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int n = 0; n < NB; ++n) acc[r][n] = 0.0f;

    const int nch = K >> 3;
    const float4* x4 = (const float4*)x;
    const long long ldx4 = K >> 2;
    const int nt = blockDim.x;
    for (int c0 = threadIdx.x; c0 < nch; c0 += nt * U) {
        uint4 w[U][R];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + u * nt;
#pragma unroll
            for (int r = 0; r < R; ++r) w[u][r] = c < nch ? ld_stream(wr[r] + c) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + u * nt;
            if (c >= nch) break;
            float wf[R][8];
#pragma unroll
            for (int r = 0; r < R; ++r) unpack8<WT>(w[u][r], wf[r]);
#pragma unroll
            for (int n = 0; n < NB; ++n) {
                const float4 xa = x4[n * ldx4 + 2 * c], xb = x4[n * ldx4 + 2 * c + 1];
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    float s = acc[r][n];
                    s = fmaf(wf[r][0], xa.x, s);
                    s = fmaf(wf[r][1], xa.y, s);
                    s = fmaf(wf[r][2], xa.z, s);
                    s = fmaf(wf[r][3], xa.w, s);
                    s = fmaf(wf[r][4], xb.x, s);
                    s = fmaf(wf[r][5], xb.y, s);
                    s = fmaf(wf[r][6], xb.z, s);
                    acc[r][n] = fmaf(wf[r][7], xb.w, s);
                }
            }
        }
    }
    gemv_reduce_store<NB, R>(acc, row0, rows, bias, y);
}

// y = x rounded to fp16 / bf16 bits
extern "C" __global__ void cast_f32_f16(const float* __restrict__ x, u16* __restrict__ y, long long n) {
    pdl_wait();
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = f2h(x[i]);
}

extern "C" __global__ void cast_f32_bf16(const float* __restrict__ x, u16* __restrict__ y, long long n) {
    pdl_wait();
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = f2bf(x[i]);
}

#ifndef __CUDACC_RTC__
template __global__ void gemv_dense<0, 1, 2>(const u16*, int, int, const float*, const float*, float*);
template __global__ void gemv_dense<1, 1, 2>(const u16*, int, int, const float*, const float*, float*);
template __global__ void gemv_dense<0, 8, 4>(const u16*, int, int, const float*, const float*, float*);
template __global__ void gemv_dense<1, 3, 4>(const u16*, int, int, const float*, const float*, float*);
#endif
