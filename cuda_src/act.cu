// Elementwise ops: SiLU(gate) * up (float32 or 16-bit inputs), x * sigmoid(gate), and a + b.
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

__device__ __forceinline__ float4 load4(float4 v) { return v; }

template <float (*WIDEN)(u16)>
__device__ __forceinline__ float4 load4_16(uint2 v) {
    return make_float4(WIDEN(v.x & 0xffff), WIDEN(v.x >> 16), WIDEN(v.y & 0xffff), WIDEN(v.y >> 16));
}

template <typename IN4, typename OUT_T, float4 (*LOAD4)(IN4), void (*STORE4)(OUT_T*, float4)>
__device__ __forceinline__ void silu_mul4(const IN4* __restrict__ gate, const IN4* __restrict__ up,
                                          OUT_T* __restrict__ out, int rows, int cols4, i64 gate_stride4,
                                          i64 up_stride4) {
    pdl_wait();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols4) return;
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        const float4 g = LOAD4(gate[r * gate_stride4 + c]), u = LOAD4(up[r * up_stride4 + c]);
        STORE4(out + ((i64)r * cols4 + c) * 4, make_float4(silu_times(g.x, u.x), silu_times(g.y, u.y),
                                                          silu_times(g.z, u.z), silu_times(g.w, u.w)));
    }
}

// float32 inputs (16-byte loads) written as float32, fp16 or bf16; and 16-bit inputs (a gate / up
// GEMM's fp16 or bf16 product; 8-byte loads: gate, up 8-byte aligned, row strides a multiple of 4)
// written in their own type.
#define SILU_MUL4(NAME, IN4, OUT_T, LOAD4, STORE4)                                                   \
    extern "C" __global__ void NAME(const IN4* __restrict__ gate, const IN4* __restrict__ up,         \
                                    OUT_T* __restrict__ out, int rows, int cols4, i64 gate_stride4,   \
                                    i64 up_stride4) {                                                 \
        silu_mul4<IN4, OUT_T, LOAD4, STORE4>(gate, up, out, rows, cols4, gate_stride4, up_stride4);   \
    }
SILU_MUL4(silu_mul4_f32, float4, float, load4, store4)
SILU_MUL4(silu_mul4_f16out, float4, u16, load4, store4_16<pq::f2h>)
SILU_MUL4(silu_mul4_bf16out, float4, u16, load4, store4_16<pq::f2bf>)
SILU_MUL4(silu_mul4_f16in, uint2, u16, load4_16<pq::h2f>, store4_16<pq::f2h>)
SILU_MUL4(silu_mul4_bf16in, uint2, u16, load4_16<pq::bf2f>, store4_16<pq::f2bf>)

// out = a + b over n contiguous elements. grid.x = ceil(n / 256), block 256.
extern "C" __global__ void add_f32(const float* a, const float* b, float* out, i64 n) {
    pdl_wait();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

// out [rows, cols] = x * sigmoid(gate): gate [rows, gate_cols] (gate_cols 1: one gate a row, or
// cols), x and gate at their row strides. grid ceil(rows * cols / 256), block 256.
extern "C" __global__ void sigmoid_mul_f32(const float* __restrict__ gate, i64 gate_stride, int gate_cols,
                                           const float* __restrict__ x, i64 x_stride, float* __restrict__ out,
                                           int rows, int cols) {
    pdl_wait();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)rows * cols) return;
    const i64 r = i / cols, c = i - r * cols;
    const float g = gate[r * gate_stride + (gate_cols == 1 ? 0 : c)];
    out[i] = x[r * x_stride + c] / (1.0f + expf(-g));
}
