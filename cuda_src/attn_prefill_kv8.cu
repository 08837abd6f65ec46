// Causal prefill attention over quantized KV pages (kv_cache_dtype int8 / fp8 / k8v4; kv_codes.cuh):
// the kernels of attn_prefill.cuh, plain and tensor-core variants, at every head dim (k8v4's values
// come in groups of 32: from 32 on; 256: plain only).
#include "attn_prefill.cuh"

PREFILL_KERNELS(i8, signed char, signed char, 16)
PREFILL_KERNELS(i8, signed char, signed char, 32)
PREFILL_KERNELS(i8, signed char, signed char, 64)
PREFILL_KERNELS(i8, signed char, signed char, 128)
PREFILL_KERNELS(e4m3, u8, u8, 16)
PREFILL_KERNELS(e4m3, u8, u8, 32)
PREFILL_KERNELS(e4m3, u8, u8, 64)
PREFILL_KERNELS(e4m3, u8, u8, 128)
PREFILL_KERNELS(k8v4, signed char, nib2, 32)
PREFILL_KERNELS(k8v4, signed char, nib2, 64)
PREFILL_KERNELS(k8v4, signed char, nib2, 128)
PREFILL_PLAIN_KERNELS(i8, signed char, signed char, 256)
PREFILL_PLAIN_KERNELS(e4m3, u8, u8, 256)
PREFILL_PLAIN_KERNELS(k8v4, signed char, nib2, 256)
