// Host build of cuda_src/gguf_units.cuh (plain C++, intrinsics emulated) so the GGUF block
// decoders and the unit dot formula can be checked against the gguf package on a CPU.
// Used by tests/test_gguf_units_host.py.
//   stdin:  qtype nblk align | one row of nblk blocks (Q6_KR: runs of 8, bodies then d's, to a multiple of 16 bytes) | nblk*QK int8 xq | nblk*QK/32 float4 xds
//   stdout: nblk*QK float32 dequantized values, then float64 sum of the unit dots
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#define PQ_HOST_SHIM
#define PQ_DEV static inline
#define __device__
#define __forceinline__ inline

struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct int4 { int x, y, z, w; };
struct float4 { float x, y, z, w; };

namespace pq {
typedef unsigned int u32_;
static inline int dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
static inline u32_ vsub4(u32_ a, u32_ b) {
    u32_ r = 0;
    for (int i = 0; i < 4; ++i) r |= (((a >> (8 * i)) - (b >> (8 * i))) & 0xffu) << (8 * i);
    return r;
}
static inline u32_ bperm(u32_ a, u32_ b, u32_ s) {
    const uint64_t v = ((uint64_t)b << 32) | a;
    u32_ r = 0;
    for (int i = 0; i < 4; ++i) {
        const u32_ sel = (s >> (4 * i)) & 0xfu;
        u32_ byte = (u32_)(v >> (8 * (sel & 7))) & 0xffu;
        if (sel & 8) byte = (byte & 0x80) ? 0xff : 0;
        r |= byte << (8 * i);
    }
    return r;
}
static inline u32_ fshr(u32_ lo, u32_ hi, u32_ s) {
    return (u32_)((((uint64_t)hi << 32) | lo) >> (s & 31));
}
static inline int popc(u32_ x) { return __builtin_popcount(x); }
static inline u32_ ldg32(const u32_* p) { return *p; }
static inline float h2f(unsigned short h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? std::ldexp((float)m, -24) : std::ldexp((float)(m | 1024), e - 25);
    if (e == 31) v = m ? NAN : INFINITY;
    return (h & 0x8000) ? -v : v;
}
}  // namespace pq

#include "gguf_units.cuh"

using namespace pq;

template <int QT>
static void run(const u8* blocks, int nblk, const int8_t* xq, const float4* xds, float* deq, double* dot) {
    constexpr int QK = QTraits<QT>::QK, NSUB = QK / 32;
    const u32* tab = table_src<QT>();
    double total = 0;
    for (int b = 0; b < nblk; ++b) {
        for (int sub = 0; sub < NSUB; ++sub) {
            Unit u;
            decode_at<QT>(blocks, nblk, b, sub, tab, u);
            int p[2];
            unit_pos<QT>(sub, p[0], p[1]);
            for (int s = 0; s < 2; ++s)
                for (int t = 0; t < 16; ++t) deq[(size_t)b * QK + p[s] + t] = unit_value(u, s, t);
            const int8_t* xb = xq + (size_t)b * QK;
            const float4* db = xds + (size_t)b * (QK / 32);
            int4 x0, x1;
            std::memcpy(&x0, xb + p[0], 16);
            std::memcpy(&x1, xb + p[1], 16);
            const float4 d0 = db[p[0] >> 5], d1 = db[p[1] >> 5];
            total += unit_dot<QT>(u, x0, x1, d0, d1, p[0], p[1]);
        }
    }
    *dot = total;
}

int main() {
    int qt, nblk, align;
    if (std::fread(&qt, 4, 1, stdin) != 1 || std::fread(&nblk, 4, 1, stdin) != 1 ||
        std::fread(&align, 4, 1, stdin) != 1) return 2;
    int qk = 0, ts = 0;
    switch (qt) {
#define C(T) case T: qk = QTraits<T>::QK; ts = QTraits<T>::TS; break;
        C(Q4_0) C(Q4_1) C(Q5_0) C(Q5_1) C(Q8_0) C(Q2_K) C(Q3_K) C(Q4_K) C(Q5_K) C(Q6_K) C(Q6_KR)
        C(IQ2_XXS) C(IQ2_XS) C(IQ2_S) C(IQ3_XXS) C(IQ3_S) C(IQ4_NL) C(IQ4_XS) C(IQ1_S) C(IQ1_M)
#undef C
        default: return 3;
    }
    const size_t bytes = (size_t)nblk * ts + (qt == Q6_KR ? (2 * nblk + 15) / 16 * 16 : 0);   // Q6_KR: the d's
    // blocks placed at byte offset `align` of a 16-aligned buffer, 16 bytes of slack after
    std::vector<uint64_t> store((bytes + 48) / 8 + 1);
    u8* blocks = (u8*)store.data() + align;
    std::vector<int8_t> xq((size_t)nblk * qk);
    std::vector<float4> xds((size_t)nblk * qk / 32);
    if (std::fread(blocks, 1, bytes, stdin) != bytes) return 4;
    if (std::fread(xq.data(), 1, xq.size(), stdin) != xq.size()) return 5;
    if (std::fread(xds.data(), sizeof(float4), xds.size(), stdin) != xds.size()) return 6;
    std::vector<float> deq((size_t)nblk * qk);
    double dot = 0;
    switch (qt) {
#define C(T) case T: run<T>(blocks, nblk, xq.data(), xds.data(), deq.data(), &dot); break;
        C(Q4_0) C(Q4_1) C(Q5_0) C(Q5_1) C(Q8_0) C(Q2_K) C(Q3_K) C(Q4_K) C(Q5_K) C(Q6_K) C(Q6_KR)
        C(IQ2_XXS) C(IQ2_XS) C(IQ2_S) C(IQ3_XXS) C(IQ3_S) C(IQ4_NL) C(IQ4_XS) C(IQ1_S) C(IQ1_M)
#undef C
    }
    std::fwrite(deq.data(), 4, deq.size(), stdout);
    std::fwrite(&dot, 8, 1, stdout);
    return 0;
}
