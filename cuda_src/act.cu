// Elementwise ops: SiLU(gate) * up (float32 or 16-bit inputs), and a + b.
#include "common.cuh"
#include "gguf_prims.cuh"

// gate, up: [rows, cols] with their own row strides (so both may be views of one fused
// gate_up projection); out: [rows, cols] contiguous. grid.x = ceil(rows * cols / 256), block 256
// (any shape; silu_mul4_* below where the shapes allow 16-byte loads).
// silu_mul_f32 writes float32; silu_mul_f16out / silu_mul_bf16out the same values rounded to
// 16-bit floats (as cast_f32_f16 / cast_f32_bf16 round): the input of a GEMM over fp16 / bf16
// weights, written without the float32 copy.
__device__ __forceinline__ float keep_f32(float x) { return x; }
__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + expf(-g)) * u; }

#define SILU_MUL(NAME, OUT_T, ROUND)                                                                  \
    extern "C" __global__ void NAME(const float* __restrict__ gate, const float* __restrict__ up,     \
                                    OUT_T* __restrict__ out, int rows, int cols, i64 gate_stride,     \
                                    i64 up_stride) {                                                  \
        pdl_wait();                                                                                   \
        const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;                                     \
        if (i >= (i64)rows * cols) return;                                                            \
        const i64 r = i / cols, c = i - r * cols;                                                     \
        const float g = gate[r * gate_stride + c];                                                    \
        out[i] = ROUND(silu_times(g, up[r * up_stride + c]));                                         \
    }
SILU_MUL(silu_mul_f32, float, keep_f32)
SILU_MUL(silu_mul_f16out, u16, pq::f2h)
SILU_MUL(silu_mul_bf16out, u16, pq::f2bf)

// The same values, 4 columns a thread with 16-byte loads, when cols and both row strides are
// multiples of 4 and gate, up are 16-byte aligned (the scalar kernels' 64-bit index division per
// value held them to ~1.5 TB/s on a prefill's [8192, 14336]). grid (ceil(cols / 4 / 256),
// min(rows, SILU_MUL4_GRID_ROWS of the launcher)), block 256; row r and every gridDim.y-th after it.
__device__ __forceinline__ void store4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }

template <u16 (*ROUND)(float)>
__device__ __forceinline__ void store4_16(u16* p, float4 v) {
    *reinterpret_cast<uint2*>(p) = make_uint2(ROUND(v.x) | (u32)ROUND(v.y) << 16, ROUND(v.z) | (u32)ROUND(v.w) << 16);
}

#define SILU_MUL4(NAME, OUT_T, STORE4)                                                                \
    extern "C" __global__ void NAME(const float4* __restrict__ gate, const float4* __restrict__ up,   \
                                    OUT_T* __restrict__ out, int rows, int cols4, i64 gate_stride4,   \
                                    i64 up_stride4) {                                                 \
        pdl_wait();                                                                                   \
        const int c = blockIdx.x * blockDim.x + threadIdx.x;                                          \
        if (c >= cols4) return;                                                                       \
        for (int r = blockIdx.y; r < rows; r += gridDim.y) {                                          \
            const float4 g = gate[r * gate_stride4 + c], u = up[r * up_stride4 + c];                  \
            STORE4(out + ((i64)r * cols4 + c) * 4, make_float4(silu_times(g.x, u.x), silu_times(g.y, u.y), \
                                                              silu_times(g.z, u.z), silu_times(g.w, u.w))); \
        }                                                                                             \
    }
SILU_MUL4(silu_mul4_f32, float, store4)
SILU_MUL4(silu_mul4_f16out, u16, store4_16<pq::f2h>)
SILU_MUL4(silu_mul4_bf16out, u16, store4_16<pq::f2bf>)

// SiLU(gate) * up over 16-bit inputs (a gate / up GEMM's fp16 or bf16 product), written in the same
// type: 4 columns a thread, 8-byte loads; gate, up 8-byte aligned with row strides of a multiple of 4;
// grid and rows as silu_mul4_*.
template <float (*WIDEN)(u16), u16 (*ROUND)(float)>
__device__ __forceinline__ void silu_mul4_h16(const uint2* __restrict__ gate, const uint2* __restrict__ up,
                                              u16* __restrict__ out, int rows, int cols4, i64 gate_stride4,
                                              i64 up_stride4) {
    pdl_wait();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols4) return;
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        const uint2 g = gate[r * gate_stride4 + c], u = up[r * up_stride4 + c];
        store4_16<ROUND>(out + ((i64)r * cols4 + c) * 4,
                         make_float4(silu_times(WIDEN(g.x & 0xffff), WIDEN(u.x & 0xffff)),
                                     silu_times(WIDEN(g.x >> 16), WIDEN(u.x >> 16)),
                                     silu_times(WIDEN(g.y & 0xffff), WIDEN(u.y & 0xffff)),
                                     silu_times(WIDEN(g.y >> 16), WIDEN(u.y >> 16))));
    }
}

#define SILU_MUL4_H16(NAME, WIDEN, ROUND)                                                             \
    extern "C" __global__ void NAME(const uint2* __restrict__ gate, const uint2* __restrict__ up,     \
                                    u16* __restrict__ out, int rows, int cols4, i64 gate_stride4,     \
                                    i64 up_stride4) {                                                 \
        silu_mul4_h16<WIDEN, ROUND>(gate, up, out, rows, cols4, gate_stride4, up_stride4);            \
    }
SILU_MUL4_H16(silu_mul4_f16in, pq::h2f, pq::f2h)
SILU_MUL4_H16(silu_mul4_bf16in, pq::bf2f, pq::f2bf)

// out = a + b over n contiguous elements. grid.x = ceil(n / 256), block 256.
extern "C" __global__ void add_f32(const float* a, const float* b, float* out, i64 n) {
    pdl_wait();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
