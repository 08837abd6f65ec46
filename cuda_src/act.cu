// Elementwise float32 ops: SiLU(gate) * up, and a + b.
#include "common.cuh"
#include "gguf_prims.cuh"

// gate, up: [rows, cols] with their own row strides (so both may be views of one fused
// gate_up projection); out: [rows, cols] contiguous. grid.x = ceil(rows * cols / 256), block 256.
// silu_mul_f32 writes float32; silu_mul_f16out / silu_mul_bf16out the same values rounded to
// 16-bit floats (as cast_f32_f16 / cast_f32_bf16 round): the input of a GEMM over fp16 / bf16
// weights, written without the float32 copy.
__device__ __forceinline__ float keep_f32(float x) { return x; }

#define SILU_MUL(NAME, OUT_T, ROUND)                                                                  \
    extern "C" __global__ void NAME(const float* __restrict__ gate, const float* __restrict__ up,     \
                                    OUT_T* __restrict__ out, int rows, int cols, i64 gate_stride,     \
                                    i64 up_stride) {                                                  \
        pdl_wait();                                                                                   \
        const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;                                     \
        if (i >= (i64)rows * cols) return;                                                            \
        const i64 r = i / cols, c = i - r * cols;                                                     \
        const float g = gate[r * gate_stride + c];                                                    \
        out[i] = ROUND(g / (1.0f + expf(-g)) * up[r * up_stride + c]);                                \
    }
SILU_MUL(silu_mul_f32, float, keep_f32)
SILU_MUL(silu_mul_f16out, u16, pq::f2h)
SILU_MUL(silu_mul_bf16out, u16, pq::f2bf)

// out = a + b over n contiguous elements. grid.x = ceil(n / 256), block 256.
extern "C" __global__ void add_f32(const float* a, const float* b, float* out, i64 n) {
    pdl_wait();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
