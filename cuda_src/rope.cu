// Rotary position embedding on float32 x [N, H, head_dim] (rows of head_dim contiguous; token
// stride given). Rotates the first 2*rot_half dims of every head, either as interleaved pairs
// (2i, 2i+1) or as halves (i, i + rot_half); the remaining dims are copied. out may alias x.
// positions: int32 or int64 [N]; inv_freq: float32 [rot_half].
#include "common.cuh"

template <typename P, bool INTERLEAVED>
__device__ __forceinline__ void rope_body(const float* x, float* out, const P* __restrict__ positions,
                                          const float* __restrict__ inv_freq, int n_tok, int n_heads,
                                          int head_dim, int rot_half, i64 x_stride, i64 out_stride) {
    const int tok = blockIdx.x;
    if (tok >= n_tok) return;
    const float pos = (float)load_index(positions, tok);
    const int half_dim = head_dim >> 1;
    const float* xt = x + (i64)tok * x_stride;
    float* ot = out + (i64)tok * out_stride;
    for (int j = threadIdx.x; j < n_heads * half_dim; j += blockDim.x) {
        const int h = j / half_dim, i = j - h * half_dim;
        const float* xh = xt + (i64)h * head_dim;
        float* oh = ot + (i64)h * head_dim;
        int ia, ib;
        if (i < rot_half) {
            ia = INTERLEAVED ? 2 * i : i;
            ib = INTERLEAVED ? 2 * i + 1 : i + rot_half;
            float s, c;
            sincosf(pos * inv_freq[i], &s, &c);
            const float a = xh[ia], b = xh[ib];
            oh[ia] = a * c - b * s;
            oh[ib] = b * c + a * s;
        } else {  // pass-through dims beyond the rotary part
            ia = 2 * i;
            ib = 2 * i + 1;
            const float a = xh[ia], b = xh[ib];
            oh[ia] = a;
            oh[ib] = b;
        }
    }
}

// grid.x = N tokens, blockDim.x = 128 (threads loop over heads * head_dim/2 pairs).
#define ROPE_KERNEL(NAME, P, IL)                                                                   \
    extern "C" __global__ void NAME(const float* x, float* out, const P* __restrict__ positions,  \
                                    const float* __restrict__ inv_freq, int n_tok, int n_heads,   \
                                    int head_dim, int rot_half, i64 x_stride, i64 out_stride) {   \
        pdl_wait();                                                                               \
        rope_body<P, IL>(x, out, positions, inv_freq, n_tok, n_heads, head_dim, rot_half,         \
                         x_stride, out_stride);                                                   \
    }

ROPE_KERNEL(rope_halves_f32_pos32, int, false)
ROPE_KERNEL(rope_halves_f32_pos64, i64, false)
ROPE_KERNEL(rope_interleaved_f32_pos32, int, true)
ROPE_KERNEL(rope_interleaved_f32_pos64, i64, true)
