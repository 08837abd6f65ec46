// RoPE's pair layout and rotation, shared by the RoPE + KV store kernel and the decode attention
// kernel that applies RoPE itself (one rounding order, so both give the same bits).
#pragma once

// Pair i of a head (i < head_dim / 2): dims (ia, ib) rotated by angle i when i < rot_half --
// adjacent dims (interleaved, GGUF) or the two halves of the rotary part (NeoX / HF) -- and the
// pass-through pairs (2i, 2i + 1) beyond the rotary part.
__device__ __forceinline__ void rope_pair_index(int i, int rot_half, bool interleaved, int& ia, int& ib) {
    if (i < rot_half) {
        ia = interleaved ? 2 * i : i;
        ib = interleaved ? 2 * i + 1 : i + rot_half;
    } else {
        ia = 2 * i;
        ib = 2 * i + 1;
    }
}

// (a, b) rotated by the angle whose cosine and sine are c, s
__device__ __forceinline__ void rope_rotate(float& a, float& b, float c, float s) {
    const float ra = a * c - b * s, rb = b * c + a * s;
    a = ra;
    b = rb;
}
