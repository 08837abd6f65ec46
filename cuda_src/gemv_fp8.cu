// FP8 (OCP E4M3) weights kept as their codes: W uint8 [rows, K] times S float32 [rows, ceil(K / 128)],
// a scale per row and 128 columns (prepare_weight spreads a checkpoint's tensor, channel or block
// scales to that grid), each scale premultiplied by 256 at upload: a code whose sign goes to bit 15
// and whose 7 exponent + mantissa bits go to bits 7..13 is the fp16 of its value times 2^-8,
// subnormals included (NaN codes 0x7f / 0xff, which checkpoints do not hold, become 1.875 * 2^-8).
//
// gemv_fp8_mma<NT, U, HW>: y[n, r] = sum_k x[n, k] W[r, k] S[r, k / 128] (+ bias[r]) for batch nb <= 8 NT
// on tensor cores (sm_80+), laid out as gemv_dense_mma.cu: a block of F8_WARPS warps on 16 rows, each
// warp a strided share of the 64-wide chunks of K, U chunks' loads in flight together (a chunk is
// half the bytes of a 16-bit weight's), HW: codes converted by the hardware's cvt.rn.f16x2.e4m3x2
// on sm_89+ (elsewhere as HW = false); lane (g, t) reads the 16 codes of rows g and
// g + 8 at k = 64c + 16t and the activations of batch rows 8j + g at the same k; a chunk's products
// are summed from zero and added times the rows' scales.  x is rounded to fp16 (saturated at
// +-65504); accumulation fp32.  Needs K % 64 == 0.  Grid: ceil(rows / 16).
// dequant_fp8_f16: rows of W as fp16 values (scale applied), the cuBLAS GEMM path's weight tile.
#include "minifloat.cuh"
#include "mma_tiles.cuh"

#define F8_WARPS 8

template <int NT, int U, bool HW>
__global__ void __launch_bounds__(F8_WARPS * 32, 2)
gemv_fp8_mma(const u8* __restrict__ W, const float* __restrict__ S, int rows, int K,
             const float* __restrict__ x, int nb, const float* __restrict__ bias, float* __restrict__ y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    __shared__ float red[F8_WARPS - 1][4 * NT][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 16, ra = min(row0 + g, rows - 1), rb = min(row0 + g + 8, rows - 1);
    const int groups = (K + 127) >> 7;
    const uint4* wa = reinterpret_cast<const uint4*>(W + (i64)ra * K) + t;
    const uint4* wb = reinterpret_cast<const uint4*>(W + (i64)rb * K) + t;
    const float* sa = S + (i64)ra * groups;
    const float* sb = S + (i64)rb * groups;
    prefetch_l2(W + (i64)row0 * K, (i64)K * (min(rows, row0 + 16) - row0));
    pdl_wait();
    const int nchunks = K >> 6;
    float c[NT][1][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) c[j][0][i] = 0.0f;
    for (int c0 = warp; c0 < nchunks; c0 += F8_WARPS * U) {
        uint4 a[U][2];
#pragma unroll
        for (int u = 0; u < U; ++u) {   // unconditional loads (past the end: the last chunk, unused)
            const int ch = min(c0 + u * F8_WARPS, nchunks - 1);
            a[u][0] = __ldcs(wa + 4 * ch);
            a[u][1] = __ldcs(wb + 4 * ch);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int ch = c0 + u * F8_WARPS;
            if (ch >= nchunks) break;
            u32 ha[8], hb[8];
            e4m3x16_to_h2x8<HW>(a[u][0], ha);
            e4m3x16_to_h2x8<HW>(a[u][1], hb);
            constexpr float unit = hw_cvt<HW>() ? 1.0f / 256.0f : 1.0f;   // the scales hold the 256
            const float s0 = sa[ch >> 1] * unit, s1 = sb[ch >> 1] * unit;
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const int n = 8 * j + g;
                const float4* xr = reinterpret_cast<const float4*>(x + (i64)min(n, nb - 1) * K + 64 * ch + 16 * t);
                float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    const u32 af[4] = {ha[2 * s], hb[2 * s], ha[2 * s + 1], hb[2 * s + 1]};
                    const float4 v = xr[s];
                    const bool use = n < nb;
                    mma_16816(p, af, use ? pack_f2h2_sat(v.x, v.y) : 0u, use ? pack_f2h2_sat(v.z, v.w) : 0u);
                }
                c[j][0][0] = fmaf(s0, p[0], c[j][0][0]);
                c[j][0][1] = fmaf(s0, p[1], c[j][0][1]);
                c[j][0][2] = fmaf(s1, p[2], c[j][0][2]);
                c[j][0][3] = fmaf(s1, p[3], c[j][0][3]);
            }
        }
    }
    mma_tiles_store<NT, 1, 1, F8_WARPS>(c, red, warp, 0, warp, lane, row0, rows, nb, nullptr, bias, y);
#else
    pdl_wait();
#endif
}

// out [nr, K] fp16 = rows r0 .. r0 + nr - 1 of W times their scales; a thread per 8 codes
extern "C" __global__ void dequant_fp8_f16(const u8* __restrict__ W, const float* __restrict__ S, int K,
                                           long long r0, int nr, __half* __restrict__ out) {
    pdl_wait();
    const int groups = (K + 127) >> 7, per_row = K >> 3;
    const long long n = (long long)nr * per_row;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / per_row;
        const int k = (int)(i - r * per_row) << 3;
        const uint2 w = *reinterpret_cast<const uint2*>(W + (r0 + r) * K + k);
        const float s = S[(r0 + r) * groups + (k >> 7)];
        u32 h[4];
        e4m3x4_to_h2x2(w.x, h[0], h[1]);
        e4m3x4_to_h2x2(w.y, h[2], h[3]);
        uint4 o;
        u32* ov = reinterpret_cast<u32*>(&o);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&h[q]));
            ov[q] = pack_f2h2(v.x * s, v.y * s);
        }
        *reinterpret_cast<uint4*>(out + r * K + k) = o;
    }
}

#ifndef __CUDACC_RTC__
template __global__ void gemv_fp8_mma<1, 2, false>(const u8*, const float*, int, int, const float*, int, const float*, float*);
template __global__ void gemv_fp8_mma<1, 2, true>(const u8*, const float*, int, int, const float*, int, const float*, float*);
template __global__ void gemv_fp8_mma<1, 4, false>(const u8*, const float*, int, int, const float*, int, const float*, float*);
template __global__ void gemv_fp8_mma<1, 4, true>(const u8*, const float*, int, int, const float*, int, const float*, float*);
template __global__ void gemv_fp8_mma<2, 2, false>(const u8*, const float*, int, int, const float*, int, const float*, float*);
template __global__ void gemv_fp8_mma<2, 2, true>(const u8*, const float*, int, int, const float*, int, const float*, float*);
template __global__ void gemv_fp8_mma<2, 4, false>(const u8*, const float*, int, int, const float*, int, const float*, float*);
template __global__ void gemv_fp8_mma<2, 4, true>(const u8*, const float*, int, int, const float*, int, const float*, float*);
#endif
