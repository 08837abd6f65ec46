// Tensor-core decode attention over quantized KV pages (kv_cache_dtype int8 / fp8 / k8v4;
// kv_codes.cuh): the kernels of attn_decode_mma.cuh at head dims 64 and 128, with K through the KRing
// and (_k16) in registers, a module of their own that fp16 caches never compile.
#include "attn_decode_mma.cuh"

DECODE_MMA_KERNEL_KV8(i8, signed char, signed char, 64)
DECODE_MMA_KERNEL_KV8(i8, signed char, signed char, 128)
DECODE_MMA_KERNEL_KV8(e4m3, u8, u8, 64)
DECODE_MMA_KERNEL_KV8(e4m3, u8, u8, 128)
DECODE_MMA_KERNEL_KV8(k8v4, signed char, nib2, 64)
DECODE_MMA_KERNEL_KV8(k8v4, signed char, nib2, 128)
