// Integer types and the few device intrinsics the GGUF block decoders use, wrapped so that
// tests/host/ can compile the decoders as plain C++ (PQ_HOST_SHIM) and check them on a CPU.
#pragma once

#ifndef PQ_HOST_SHIM
#define PQ_DEV __device__ __forceinline__
#endif

namespace pq {

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#ifndef PQ_HOST_SHIM
PQ_DEV int dp4a(int a, int b, int c) { return __dp4a(a, b, c); }
PQ_DEV u32 vsub4(u32 a, u32 b) { return __vsub4(a, b); }
PQ_DEV u32 bperm(u32 a, u32 b, u32 s) { return __byte_perm(a, b, s); }
PQ_DEV u32 fshr(u32 lo, u32 hi, u32 s) { return __funnelshift_r(lo, hi, s); }
PQ_DEV int popc(u32 x) { return __popc(x); }
PQ_DEV u32 ldg32(const u32* p) { return __ldg(p); }   // weights: read-only for the whole kernel
PQ_DEV float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
PQ_DEV u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#endif

PQ_DEV float bf2f(u16 b) {
    union { u32 u; float f; } c;
    c.u = (u32)b << 16;
    return c.f;
}

PQ_DEV u16 f2bf(float f) {   // round to nearest even (NaN stays NaN)
    union { u32 u; float f; } c;
    c.f = f;
    if ((c.u & 0x7fffffffu) > 0x7f800000u) return (u16)((c.u >> 16) | 0x40);
    return (u16)((c.u + 0x7fffu + ((c.u >> 16) & 1u)) >> 16);
}

PQ_DEV u16 ld16(const u8* p) { return *(const u16*)p; }
PQ_DEV u32 ld32(const u8* p) { return *(const u32*)p; }

// N 16-byte vectors from a 16-byte aligned address, as 4N words
template <int N>
PQ_DEV void ld16b(const u8* p, u32* out) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const uint4 v = ((const uint4*)p)[i];
        out[4 * i] = v.x;
        out[4 * i + 1] = v.y;
        out[4 * i + 2] = v.z;
        out[4 * i + 3] = v.w;
    }
}

// N 32-bit words starting at a 2-byte aligned address (most GGUF block sizes are even, not
// multiples of 4): N+1 aligned loads and funnel shifts.  The extra word is read only when p
// is misaligned; it lies inside the block for every caller.  GLOBAL: p is global memory that no
// thread writes during the kernel (weights), read through the read-only path; otherwise p may
// also point to shared memory (kernels that stage the blocks there).
template <int N, bool GLOBAL = false>
PQ_DEV void ldu(const u8* p, u32* out) {
    const unsigned long long a = (unsigned long long)p;
    const u32* q = (const u32*)(a & ~3ull);
    const u32 sh = (u32)(a & 3ull) * 8u;
    u32 w[N + 1];
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = GLOBAL ? ldg32(q + i) : q[i];
    w[N] = sh ? (GLOBAL ? ldg32(q + N) : q[N]) : 0u;
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = fshr(w[i], w[i + 1], sh);
}

// 4 low bits of b -> bit 4 of each byte
PQ_DEV u32 bits_to_b4(u32 b) {
    return ((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25);
}

// 4 low bits of b -> 0xFF in each byte whose bit is set
PQ_DEV u32 bits_to_mask(u32 b) {
    return (((b & 0xfu) * 0x00204081u) & 0x01010101u) * 0xffu;
}

// sign index (7 bits) -> 8-bit sign mask with even parity (ksigns_iq2xs)
PQ_DEV u32 ksign(u32 idx) { return idx | ((u32)(popc(idx) & 1) << 7); }

// g: 4 unsigned bytes, s4: 4 sign bits -> bytes negated where the bit is set
PQ_DEV u32 apply_signs(u32 g, u32 s4) {
    const u32 m = bits_to_mask(s4);
    return vsub4(g ^ m, m);
}

// 4 nibbles (0-15, one per byte) -> the int8 values t[nibble] of a 16-entry table t0..t3
PQ_DEV u32 lut16(u32 nib, u32 t0, u32 t1, u32 t2, u32 t3) {
    const u32 x = nib & 0x07070707u;
    const u32 sel = (x & 7u) | ((x >> 4) & 0x70u) | ((x >> 8) & 0x700u) | ((x >> 12) & 0x7000u);
    const u32 lo = bperm(t0, t1, sel), hi = bperm(t2, t3, sel);
    const u32 m = ((nib & 0x08080808u) >> 3) * 0xffu;
    return (lo & ~m) | (hi & m);
}

}  // namespace pq
