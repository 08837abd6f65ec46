// Causal prefill attention over fp16 KV pages: the kernels of attn_prefill.cuh (which says how
// they work) for every head dim, plain and tensor-core variants (256: plain only).
#include "attn_prefill.cuh"

PREFILL_KERNELS(f16, __half, __half, 16)
PREFILL_KERNELS(f16, __half, __half, 32)
PREFILL_KERNELS(f16, __half, __half, 64)
PREFILL_KERNELS(f16, __half, __half, 128)
PREFILL_PLAIN_KERNELS(f16, __half, __half, 256)
