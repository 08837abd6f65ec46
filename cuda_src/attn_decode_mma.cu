// Tensor-core decode attention over fp16 KV pages: the kernels of attn_decode_mma.cuh (which says
// how they work) at head dims 64 and 128.
#include "attn_decode_mma.cuh"

DECODE_MMA_KERNEL(f16, __half, __half, 64)
DECODE_MMA_KERNEL(f16, __half, __half, 128)
