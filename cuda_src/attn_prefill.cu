// Causal prefill attention over fp16 KV pages: the kernels of attn_prefill.cuh (which says how
// they work) for every head dim, plain and tensor-core variants.
#include "attn_prefill.cuh"

PREFILL_ALL_KERNELS(f16, __half)
