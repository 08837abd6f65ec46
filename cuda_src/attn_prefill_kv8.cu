// Causal prefill attention over 8-bit KV pages (kv_cache_dtype int8 / fp8; kv_codes.cuh): the
// kernels of attn_prefill.cuh for every head dim, plain and tensor-core variants.
#include "attn_prefill.cuh"

PREFILL_ALL_KERNELS(i8, signed char)
PREFILL_ALL_KERNELS(e4m3, u8)
