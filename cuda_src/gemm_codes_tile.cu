// FP8 / NVFP4 weights kept as their codes (gemv_fp8.cu's and gemv_nvfp4.cu's layouts and scales) for
// decode batches past the GEMVs' 16, on fp16 tensor cores (sm_80+), the activations staged once a block
// in shared memory. (The GEMVs' warps each read their batch's activations for their 16 rows alone: at
// batch 64, 8 bytes of fp16 activations a byte of FP8 codes.)
//
// gemm_codes_tile<F, NT, MT, RG, KW, ST, HW, SPLIT>: y[n, r] = sum_k x16[n, k] W[r, k] (scales) (+ bias[r]) for
// n < nb <= 8 NT. A block of RG row groups (MT 16-row tiles each) x KW warps over K; per step it copies with
// cp.async, ST - 1 steps ahead, KW 64-column chunks of its rows' codes (NVFP4: and their scale codes) and
// of the 8 NT activation rows into one of ST shared-memory stages; warp (rg, kw) = (warp % RG, warp / RG)
// takes chunk KW s + kw of step s: lane (g, t) decodes the 16 codes of rows g and g + 8 at k = 16t as the
// GEMVs do (FP8: HW, sm_89+'s cvt; NVFP4: times the group's scale) and multiplies them by the NT 8-column
// tiles. FP8 adds each chunk's sums times the rows' scales; NVFP4 multiplies the sums by RS at the end.
// The KW warps of a row group add their tiles at the end (mma_tiles_store).
// SPLIT: split K (gridDim.y = SK, for weights with too few row blocks to fill the SMs): block (x, s) takes
// the s-th of SK runs of chunks and writes its sums to ws [SK][nb][rows]; the last of a row block's SK
// blocks to finish (counters[x], left at 0 again) adds the SK parts in order into y, so the sums do not
// depend on which finishes last.
// x16: fp16 [nb, K] (rounded by the kernel that wrote it). Block: 32 RG KW threads; dynamic shared memory
// max(CtLayout::SMEM, the end's reduction); grid: (ceil(rows / (16 MT RG)), SK). Needs K % 64 == 0.
#include "minifloat.cuh"
#include "mma_tiles.cuh"

#define CODES_FP8 0
#define CODES_NVFP4 1

// One chunk slot of a stage: the block's rows' codes [ROWS][WB] (a lane's 16-byte / 8-byte loads of rows
// g, g + 8 at 16t / 8t hit distinct banks), NVFP4's scale codes [ROWS][4], then the activations
// [8 NT][XROW] (64 fp16 and 16 bytes of padding: a quarter warp's 16-byte loads of rows g, g + 1 at
// 32t, 32t + 16 hit distinct banks).
template <int F, int NT, int MT, int RG, int KW, int ST>
struct CtLayout {
    static constexpr int ROWS = 16 * MT * RG;
    static constexpr int WB = F == CODES_FP8 ? 64 : 32;
    static constexpr int SC_OFF = ROWS * WB;
    static constexpr int X_OFF = SC_OFF + (F == CODES_NVFP4 ? 4 * ROWS : 0);
    static constexpr int XROW = 144;
    static constexpr int SLOT = X_OFF + 8 * NT * XROW;
    static constexpr int STAGE = KW * SLOT, SMEM = ST * STAGE, THREADS = 32 * RG * KW;
};

// Codes (and NVFP4's scale codes) of step `step`'s chunks (from c0, below c1) into a stage: issued before
// pdl_wait (constant).
template <int F, int NT, int MT, int RG, int KW, int ST>
__device__ __forceinline__ void ct_load_w(u8* stage, const u8* __restrict__ W, const u8* __restrict__ S4, int rows,
                                          int K, int row0, int step, int c0, int c1) {
    using L = CtLayout<F, NT, MT, RG, KW, ST>;
    constexpr int P = L::WB / 16;
    const i64 row_bytes = F == CODES_FP8 ? K : K / 2;
#pragma unroll
    for (int s = 0; s < KW; ++s) {
        const int ch = c0 + KW * step + s;
        if (ch >= c1) break;
        u8* base = stage + s * L::SLOT;
        for (int i = threadIdx.x; i < L::ROWS * P; i += L::THREADS) {
            const int r = i / P, p = i - r * P;
            cp_async16(base + r * L::WB + 16 * p, W + (i64)min(row0 + r, rows - 1) * row_bytes + ch * L::WB + 16 * p);
        }
        if constexpr (F == CODES_NVFP4) {
            for (int r = threadIdx.x; r < L::ROWS; r += L::THREADS)
                cp_async_zfill<4>(base + L::SC_OFF + 4 * r, S4 + (i64)min(row0 + r, rows - 1) * (K / 16) + 4 * ch, true);
        }
    }
}

// Activations of step `step`'s chunks into a stage; rows past nb are zeros.
template <int F, int NT, int MT, int RG, int KW, int ST>
__device__ __forceinline__ void ct_load_x(u8* stage, const __half* __restrict__ x16, int nb, int K, int step,
                                          int c0, int c1) {
    using L = CtLayout<F, NT, MT, RG, KW, ST>;
#pragma unroll
    for (int s = 0; s < KW; ++s) {
        const int ch = c0 + KW * step + s;
        if (ch >= c1) break;
        u8* xs = stage + s * L::SLOT + L::X_OFF;
        for (int i = threadIdx.x; i < 8 * NT * 8; i += L::THREADS) {
            const int n = i >> 3, p = i & 7;
            const bool ok = n < nb;
            cp_async_zfill<16>(xs + n * L::XROW + 16 * p, x16 + (i64)(ok ? n : 0) * K + 64 * ch + 8 * p, ok);
        }
    }
}

// A lane's codes of rows r, r + 8 of a chunk slot -> fp16 pairs (k order; FP8 without its scale, NVFP4
// times its group's scale)
template <int F, bool HW>
__device__ __forceinline__ void ct_decode(const u8* slot, int sc_off, int r, int t, u32 (&ha)[8], u32 (&hb)[8]) {
    if constexpr (F == CODES_FP8) {
        e4m3x16_to_h2x8<HW>(*reinterpret_cast<const uint4*>(slot + r * 64 + 16 * t), ha);
        e4m3x16_to_h2x8<HW>(*reinterpret_cast<const uint4*>(slot + (r + 8) * 64 + 16 * t), hb);
    } else {
        e2m1x16_to_h2x8(*reinterpret_cast<const uint2*>(slot + r * 32 + 8 * t), slot[sc_off + 4 * r + t], ha);
        e2m1x16_to_h2x8(*reinterpret_cast<const uint2*>(slot + (r + 8) * 32 + 8 * t), slot[sc_off + 4 * (r + 8) + t], hb);
    }
}

template <int F, int NT, int MT, int RG, int KW, int ST, bool HW, bool SPLIT>
__global__ void __launch_bounds__(32 * RG * KW, 2)
gemm_codes_tile(const u8* __restrict__ W, const void* __restrict__ S, const float* __restrict__ RS, int rows, int K,
                const __half* __restrict__ x16, int nb, const float* __restrict__ bias, float* __restrict__ y,
                float* __restrict__ ws, int* __restrict__ counters) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    using L = CtLayout<F, NT, MT, RG, KW, ST>;
    extern __shared__ __align__(16) u8 ct_smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int rg = warp % RG, kw = warp / RG, row0 = blockIdx.x * L::ROWS;
    const int nchunks = K >> 6, groups = (K + 127) >> 7, sk = SPLIT ? gridDim.y : 1, split = SPLIT ? blockIdx.y : 0;
    const int c0 = SPLIT ? (int)((i64)nchunks * split / sk) : 0;
    const int c1 = SPLIT ? (int)((i64)nchunks * (split + 1) / sk) : nchunks;
    const int steps = (c1 - c0 + KW - 1) / KW;
    const u8* S4 = reinterpret_cast<const u8*>(S);
    const float* S8 = reinterpret_cast<const float*>(S);
#pragma unroll
    for (int s = 0; s < ST - 1; ++s)
        if (s < steps) ct_load_w<F, NT, MT, RG, KW, ST>(ct_smem + s * L::STAGE, W, S4, rows, K, row0, s, c0, c1);
    pdl_wait();
#pragma unroll
    for (int s = 0; s < ST - 1; ++s) {
        if (s < steps) ct_load_x<F, NT, MT, RG, KW, ST>(ct_smem + s * L::STAGE, x16, nb, K, s, c0, c1);
        cp_async_commit();
    }
    float acc[NT][MT][4];
    mma_tiles_zero(acc);
    constexpr float unit = hw_cvt<HW>() ? 1.0f / 256.0f : 1.0f;   // FP8: the scales hold 2^8 (gemv_fp8.cu)
    const auto load = [&](int stage, int step) {
        u8* st = ct_smem + stage * L::STAGE;
        ct_load_w<F, NT, MT, RG, KW, ST>(st, W, S4, rows, K, row0, step, c0, c1);
        ct_load_x<F, NT, MT, RG, KW, ST>(st, x16, nb, K, step, c0, c1);
    };
    cp_async_stages<ST>(steps, load, [&](int stage, int it) {
        const int ch = c0 + KW * it + kw;
        if (ch >= c1) return;
        const u8* slot = ct_smem + stage * L::STAGE + kw * L::SLOT;
        u32 ha[MT][8], hb[MT][8];
        float sa[MT], sb[MT];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            const int r = 16 * (MT * rg + m) + g;
            ct_decode<F, HW>(slot, L::SC_OFF, r, t, ha[m], hb[m]);
            if constexpr (F == CODES_FP8) {
                sa[m] = __ldg(S8 + (i64)min(row0 + r, rows - 1) * groups + (ch >> 1)) * unit;
                sb[m] = __ldg(S8 + (i64)min(row0 + r + 8, rows - 1) * groups + (ch >> 1)) * unit;
            }
        }
        const u8* xs = slot + L::X_OFF + g * L::XROW + 32 * t;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            if (8 * j >= nb) break;
            const uint4 x0 = *reinterpret_cast<const uint4*>(xs + 8 * j * L::XROW);        // k 16t .. 16t + 7
            const uint4 x1 = *reinterpret_cast<const uint4*>(xs + 8 * j * L::XROW + 16);   // k 16t + 8 .. 16t + 15
            const u32 b[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                if constexpr (F == CODES_FP8) {
                    float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        const u32 af[4] = {ha[m][2 * q], hb[m][2 * q], ha[m][2 * q + 1], hb[m][2 * q + 1]};
                        mma_16816(p, af, b[2 * q], b[2 * q + 1]);
                    }
                    acc[j][m][0] = fmaf(sa[m], p[0], acc[j][m][0]);
                    acc[j][m][1] = fmaf(sa[m], p[1], acc[j][m][1]);
                    acc[j][m][2] = fmaf(sb[m], p[2], acc[j][m][2]);
                    acc[j][m][3] = fmaf(sb[m], p[3], acc[j][m][3]);
                } else {
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        const u32 af[4] = {ha[m][2 * q], hb[m][2 * q], ha[m][2 * q + 1], hb[m][2 * q + 1]};
                        mma_16816(acc[j][m], af, b[2 * q], b[2 * q + 1]);
                    }
                }
            }
        }
    });
    if constexpr (KW > 1) __syncthreads();   // the stages become red: every warp is done reading them
    mma_tiles_store<NT, MT, RG, KW>(acc, reinterpret_cast<float(*)[NT * MT * 4][32]>(ct_smem), warp, rg, kw, lane,
                                    row0 + 16 * MT * rg, rows, nb, F == CODES_NVFP4 ? RS : nullptr,
                                    split == 0 ? bias : nullptr, SPLIT ? ws + (i64)split * nb * rows : y);
    if constexpr (SPLIT) split_k_fixup(ws, counters, sk, rows, nb, row0, L::ROWS, y);
#else
    pdl_wait();
#endif
}

#ifndef __CUDACC_RTC__
// nvcc-only instances (the module NVRTC builds names its own)
#define GEMM_CODES_TILE(F, NT, MT, RG, KW, ST, HW, SPLIT) \
    template __global__ void gemm_codes_tile<F, NT, MT, RG, KW, ST, HW, SPLIT>( \
    const u8*, const void*, const float*, int, int, const __half*, int, const float*, float*, float*, int*);
GEMM_CODES_TILE(CODES_FP8, 8, 2, 4, 1, 3, true, false)
GEMM_CODES_TILE(CODES_FP8, 4, 1, 2, 4, 2, false, true)
GEMM_CODES_TILE(CODES_NVFP4, 8, 2, 4, 1, 3, false, true)
GEMM_CODES_TILE(CODES_NVFP4, 4, 1, 2, 4, 2, false, false)
#endif
