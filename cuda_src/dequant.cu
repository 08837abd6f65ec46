// GGUF blocks -> float (get_rows: embedding lookup) or fp16 (weights for the cuBLAS prefill
// GEMM), and the gather of dense fp16 / bf16 rows.  One thread per 32-value unit (gguf_units.cuh).
#include "gguf_units.cuh"
#include "pdl.cuh"

using namespace pq;

// out[i, :] = float32 of row ids[i] of W (row i when ids is null; an embedding lookup). Ids are
// clamped into [0, wrows).  Grid-stride, 256 threads.
template <int QT, typename IdxT>
__global__ void __launch_bounds__(256)
dequant_rows(const u8* __restrict__ W, long long bpr, int wrows, const IdxT* __restrict__ ids,
             int nrows, int K, float* __restrict__ out) {
    pdl_wait();
    constexpr int QK = QTraits<QT>::QK, NSUB = QK / 32, TAB = QTraits<QT>::TAB;
    __shared__ u32 tab_s[TAB > 0 ? TAB : 1];
    const u32* tab = stage_table<QT>(tab_s);
    const long long upr = (long long)(K / QK) * NSUB;
    const long long total = (long long)nrows * upr;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long row = i / upr;
        const int t = (int)(i - row * upr), blk = t / NSUB, sub = t % NSUB;
        long long src = ids ? (long long)ids[row] : row;
        src = src < 0 ? 0 : (src >= wrows ? wrows - 1 : src);
        Unit u;
        decode_at<QT>(W + src * bpr, K / QK, blk, sub, tab, u);
        int p[2];
        unit_pos<QT>(sub, p[0], p[1]);
        const long long base = row * K + (long long)blk * QK;
#pragma unroll
        for (int s = 0; s < 2; ++s) {
            float v[16];
#pragma unroll
            for (int j = 0; j < 16; ++j) v[j] = unit_value(u, s, j);
            float4* o = (float4*)(out + base + p[s]);
#pragma unroll
            for (int j = 0; j < 4; ++j) o[j] = make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
        }
    }
}

// out [nrows, K] fp16 = rows 0 .. nrows - 1 of W (bpr bytes a row): the prefill GEMM's scratch tile
// (nrows * K < 2^31). A block of 256 threads stages the blocks of its 256 units in shared memory with
// coalesced 16-byte loads, decodes one unit a thread there, and stores its 8192 values with coalesced
// 16-byte stores (a unit's two 16-value segments lie apart in its row: stored from registers they
// half-fill sectors; H200 4096 x 14336 Q4_K: 80 us, 1.9 TB/s that way). The blocks of all types but
// Q6_KR follow each other across rows; Q6_KR's are staged block by block (block_at), their d's read
// from global memory.
template <int QT>
__global__ void __launch_bounds__(256)
dequant_tile_f16(const u8* __restrict__ W, long long bpr, int nrows, int K, u16* __restrict__ out) {
    pdl_wait();
    constexpr int QK = QTraits<QT>::QK, TS = QTraits<QT>::TS, NSUB = QK / 32, TAB = QTraits<QT>::TAB;
    constexpr int UB = 256, NB = UB / NSUB;             // units, blocks of W a thread block
    __shared__ uint4 in_s[NB * TS / 16 + 2];
    __shared__ uint4 out_s[UB * 4];
    __shared__ u32 tab_s[TAB > 0 ? TAB : 1];
    const u32* tab = stage_table<QT>(tab_s);
    const int u0 = blockIdx.x * UB, nunits = min(UB, nrows * (K / 32) - u0), nblk = K / QK, b0 = u0 / NSUB;
    int shift = 0;
    if constexpr (QT == Q6_KR) {
        constexpr int P = TS / 16;                      // 16-byte pieces a block
        for (int i = threadIdx.x; i < nunits / NSUB * P; i += UB) {
            const int b = b0 + i / P;
            in_s[i] = *(const uint4*)(block_at<QT>(W + (long long)(b / nblk) * bpr, b % nblk) + 16 * (i % P));
        }
    } else {
        const u8* g = W + (long long)b0 * TS;
        shift = (int)((size_t)g & 15);
        const int nin = (nunits / NSUB * TS + shift + 15) / 16;
        const uint4* ga = (const uint4*)(g - shift);    // may read up to 15 bytes past the last block: _PAD
        for (int i = threadIdx.x; i < nin; i += UB) in_s[i] = ga[i];
    }
    __syncthreads();
    const int t = threadIdx.x;
    if (t < nunits) {
        const int b = b0 + t / NSUB;
        Unit u;
        decode<QT>((const u8*)in_s + shift + (t / NSUB) * TS, block_d<QT>(W + (long long)(b / nblk) * bpr, nblk, b % nblk),
                   t % NSUB, tab, u);
        int p[2];
        unit_pos<QT>(t % NSUB, p[0], p[1]);
#pragma unroll
        for (int s = 0; s < 2; ++s) {
            u32 h[8];
#pragma unroll
            for (int j = 0; j < 8; ++j)
                h[j] = (u32)f2h(unit_value(u, s, 2 * j)) | ((u32)f2h(unit_value(u, s, 2 * j + 1)) << 16);
            uint4* o = (uint4*)((u16*)out_s + (t / NSUB) * QK + p[s]);
            o[0] = make_uint4(h[0], h[1], h[2], h[3]);
            o[1] = make_uint4(h[4], h[5], h[6], h[7]);
        }
    }
    __syncthreads();
    uint4* o = (uint4*)(out + (long long)u0 * 32);
    for (int i = threadIdx.x; i < nunits * 4; i += UB) o[i] = out_s[i];
}

// out[i, :] = float32 of row ids[i] of a dense fp16 (WT 0) or bf16 (WT 1) matrix [wrows, K]
template <int WT, typename IdxT>
__global__ void __launch_bounds__(256)
get_rows_dense(const u16* __restrict__ W, int wrows, int K, const IdxT* __restrict__ ids, int nrows,
               float* __restrict__ out) {
    pdl_wait();
    const long long total = (long long)nrows * K;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long row = i / K, col = i - row * K;
        long long src = (long long)ids[row];
        src = src < 0 ? 0 : (src >= wrows ? wrows - 1 : src);
        const u16 b = W[src * K + col];
        out[i] = WT == 0 ? h2f(b) : bf2f(b);
    }
}

#ifndef __CUDACC_RTC__
#define PQ_INST(T)                                                                                       \
    template __global__ void dequant_rows<T, int>(const u8*, long long, int, const int*, int, int, float*); \
    template __global__ void dequant_tile_f16<T>(const u8*, long long, int, int, u16*);
PQ_INST(Q4_0) PQ_INST(Q4_1) PQ_INST(Q5_0) PQ_INST(Q5_1) PQ_INST(Q8_0) PQ_INST(Q2_K) PQ_INST(Q3_K)
PQ_INST(Q4_K) PQ_INST(Q5_K) PQ_INST(Q6_K) PQ_INST(Q6_KR) PQ_INST(IQ2_XXS) PQ_INST(IQ2_XS) PQ_INST(IQ2_S)
PQ_INST(IQ3_XXS) PQ_INST(IQ3_S) PQ_INST(IQ4_NL) PQ_INST(IQ4_XS) PQ_INST(IQ1_S) PQ_INST(IQ1_M)
#undef PQ_INST
template __global__ void dequant_rows<Q8_0, long long>(const u8*, long long, int, const long long*, int, int,
                                                       float*);
template __global__ void get_rows_dense<0, int>(const u16*, int, int, const int*, int, float*);
template __global__ void get_rows_dense<1, long long>(const u16*, int, int, const long long*, int, float*);
#endif
