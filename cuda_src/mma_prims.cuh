// Tensor-core primitives (sm_80+; empty bodies on older archs, whose launchers never pick
// the kernels that use them): fp16 / bf16 packing, mma.sync (fp16, bf16, int8) and ldmatrix.
#pragma once

#include "common.cuh"

__device__ __forceinline__ u32 pack_f2h2(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<u32*>(&h);
}

__device__ __forceinline__ u32 pack_h2(__half lo, __half hi) {
    __half2 h = __halves2half2(lo, hi);
    return *reinterpret_cast<u32*>(&h);
}

// c[16x8] += a[16x16] * b[16x8]; per-thread fragments as in the PTX ISA (groupID = lane / 4,
// t = lane % 4): a: {(g, 2t..), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)}; b: {(k 2t.., n g),
// (k 2t+8.., n g)}; c: {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)}.
__device__ __forceinline__ void mma_16816(float* c, const u32* a, u32 b0, u32 b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// mma_16816 for the rows g only (the results of rows g + 8 are dropped, whatever a holds there):
// c[0], c[1] accumulate, c[2], c[3] are neither read nor written, so a caller's row-g+8
// accumulators need no registers.
__device__ __forceinline__ void mma_16816_top(float* c, const u32* a, u32 b0, u32 b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "{\n.reg .f32 d2, d3;\n"
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,d2,d3}, {%2,%3,%4,%5}, {%6,%7}, {%0,%1,%8,%8};\n}\n"
        : "+f"(c[0]), "+f"(c[1])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
#endif
}

// The same with bf16 a and b.
__device__ __forceinline__ void mma_16816_bf16(float* c, const u32* a, u32 b0, u32 b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ u32 pack_f2bf2(float lo, float hi) {
    u32 r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

// Integer tiles: c[16x8] (int32) += a (int8) * b (int8), fragments as above with 4 int8 per
// register: m16n8k32 a: {(g, 4t..), (g+8, 4t..), (g, 16+4t..), (g+8, 16+4t..)}, b: {(k 4t.., n g),
// (k 16+4t.., n g)}; m16n8k16 a: {(g, 4t..), (g+8, 4t..)}, b: (k 4t.., n g).
__device__ __forceinline__ void mma_s8_16832(int* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// the same with unsigned a (bytes 0..255)
__device__ __forceinline__ void mma_u8s8_16832(int* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ void mma_s8_16816(int* c, u32 a0, u32 a1, u32 b0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
#endif
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, and register i of
// lane l gets matrix i's (row l/4, cols 2(l%4)..+1) -- or with .trans its (rows 2(l%4)..+1, col l/4).
__device__ __forceinline__ void ldsm_x4(u32* r, const __half* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const u32 a = (u32)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
#endif
}

__device__ __forceinline__ void ldsm_x4_trans(u32* r, const __half* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const u32 a = (u32)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
#endif
}

// Sum / max over the four lanes (t = lane % 4) that hold one row of an mma fragment.
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(PC_FULL_MASK, v, 1);
    return v + __shfl_xor_sync(PC_FULL_MASK, v, 2);
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(PC_FULL_MASK, v, 1));
    return fmaxf(v, __shfl_xor_sync(PC_FULL_MASK, v, 2));
}

// One online-softmax step over the NT n-tiles of a score fragment (c layout of mma_16816: rows
// g and g + 8, "a" and "b"): s holds log2-scaled scores, -inf where masked; mx_a / mx_b are this
// lane's maxima of them; m_* / l_* the rows' running max and (lane-partial) sum. s becomes
// exp2(s - max); al_* are the factors that rescale the rows' earlier output. A row with no key
// yet keeps m = -inf and p = 0.
// ROW_B false: row b is unused (mma_16816_top's callers); its state is left as it is and its p is 0.
template <int NT, bool ROW_B = true>
__device__ __forceinline__ void softmax_step(float (&s)[NT][4], float mx_a, float mx_b, float& m_a, float& m_b,
                                             float& l_a, float& l_b, float& al_a, float& al_b) {
    const float mn_a = fmaxf(m_a, quad_max(mx_a)), mn_b = ROW_B ? fmaxf(m_b, quad_max(mx_b)) : m_b;
    const float ms_a = mn_a == pc_neg_inf() ? 0.0f : mn_a;
    const float ms_b = mn_b == pc_neg_inf() ? 0.0f : mn_b;
    al_a = exp2f(m_a - ms_a);
    al_b = ROW_B ? exp2f(m_b - ms_b) : 0.0f;
    m_a = mn_a;
    m_b = mn_b;
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            s[j][e] = exp2f(s[j][e] - ms_a);
            s[j][2 + e] = ROW_B ? exp2f(s[j][2 + e] - ms_b) : 0.0f;
            sum_a += s[j][e];
            sum_b += s[j][2 + e];
        }
    l_a = l_a * al_a + sum_a;
    if (ROW_B) l_b = l_b * al_b + sum_b;
}
