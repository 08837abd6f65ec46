// GEMV over raw GGUF blocks with fp32 activations (batch 1-8): each weight unit of 32 values
// (gguf_units.cuh) is dequantized in registers and dotted with the activations in fp32, so
// the result matches the NumPy reference (float32 math on dequantized weights) to rounding.
// The int8 path (gemv_gguf.cu, llama.cpp's MMVQ) reads the same bytes but quantizes the
// activations first, which moves greedy tokens away from the reference.
//
// gemv_gguf_f32<QT, NB, R>: same grid and block shape as gemv_gguf.
#include "gguf_units.cuh"
#include "gemv_reduce.cuh"

using namespace pq;

// sum over 16 int8 weights (4 words) times 16 floats (4 float4), and the sum of the floats
PQ_DEV float dot16f(const u32* w, const float4* x, float& xsum) {
    float s = 0.0f, t = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const u32 q = w[i];
        const float4 v = x[i];
        s = fmaf((float)(i8)(q & 0xffu), v.x, s);
        s = fmaf((float)(i8)((q >> 8) & 0xffu), v.y, s);
        s = fmaf((float)(i8)((q >> 16) & 0xffu), v.z, s);
        s = fmaf((float)(i8)(q >> 24), v.w, s);
        t += (v.x + v.y) + (v.z + v.w);
    }
    xsum = t;
    return s;
}

template <int QT, int NB, int R>
__global__ void __launch_bounds__(GEMV_THREADS)
gemv_gguf_f32(const u8* __restrict__ W, long long bpr, int rows, int K, const float* __restrict__ x,
              const float* __restrict__ bias, float* __restrict__ y) {
    constexpr int QK = QTraits<QT>::QK, TS = QTraits<QT>::TS, NSUB = QK / 32, TAB = QTraits<QT>::TAB;
    __shared__ u32 tab_s[TAB > 0 ? TAB : 1];
    const u32* tab = nullptr;
    if constexpr (TAB > 0) {
        const u32* src = table_src<QT>();
        for (int i = threadIdx.x; i < TAB; i += blockDim.x) tab_s[i] = src[i];
        __syncthreads();
        tab = tab_s;
    }
    const int row0 = blockIdx.x * R;
    const u8* wr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wr[r] = W + (long long)min(row0 + r, rows - 1) * bpr;

    float acc[R][NB];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int n = 0; n < NB; ++n) acc[r][n] = 0.0f;

    const int nunits = (K / QK) * NSUB;
    for (int t = threadIdx.x; t < nunits; t += blockDim.x) {
        const int blk = t / NSUB, sub = t % NSUB;
        Unit u[R];
#pragma unroll
        for (int r = 0; r < R; ++r) decode<QT>(wr[r] + (long long)blk * TS, sub, tab, u[r]);
        int p0, p1;
        unit_pos<QT>(sub, p0, p1);
#pragma unroll
        for (int n = 0; n < NB; ++n) {
            const float* xb = x + (long long)n * K + (long long)blk * QK;
            float4 x0[4], x1[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                x0[i] = ((const float4*)(xb + p0))[i];
                x1[i] = ((const float4*)(xb + p1))[i];
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                float xs0, xs1;
                const float s0 = dot16f(u[r].w, x0, xs0), s1 = dot16f(u[r].w + 4, x1, xs1);
                float v = u[r].a0 * s0 + u[r].a1 * s1;
                if constexpr (QTraits<QT>::MIN) v += u[r].b0 * xs0 + u[r].b1 * xs1;
                acc[r][n] += v;
            }
        }
    }
    gemv_reduce_store<NB, R>(acc, row0, rows, bias, y);
}

#ifndef __CUDACC_RTC__
#define PQ_INST(T)                                                                                  \
    template __global__ void gemv_gguf_f32<T, 2, 4>(const u8*, long long, int, int, const float*, \
                                                    const float*, float*);
PQ_INST(Q4_0) PQ_INST(Q4_1) PQ_INST(Q5_0) PQ_INST(Q5_1) PQ_INST(Q8_0) PQ_INST(Q2_K) PQ_INST(Q3_K)
PQ_INST(Q4_K) PQ_INST(Q5_K) PQ_INST(Q6_K) PQ_INST(IQ2_XXS) PQ_INST(IQ3_XXS) PQ_INST(IQ4_XS)
#undef PQ_INST
#endif
