// GEMV over raw GGUF blocks with fp32 activations (batch 1-8): each weight unit of 32 values
// (gguf_units.cuh) is dequantized in registers and dotted with the activations in fp32, so
// the result matches the NumPy reference (float32 math on dequantized weights) to rounding.
// The int8 path (gemv_gguf.cu, llama.cpp's MMVQ) reads the same bytes but quantizes the
// activations first, which moves greedy tokens away from the reference.
//
// Three launch shapes, one unit arithmetic (unit_accum: every variant gives the same per-unit
// partial sums; only the order of the final cross-thread sum differs):
//   gemv_gguf_f32<QT, NB, R>        block of 32-128 threads strides over the units of R rows;
//   gemv_gguf_f32_lanes<QT,NB,R,L,SILU>  short rows: groups of L lanes each own R rows (128/L
//                                   groups per block of 128), two units in flight per lane,
//                                   shuffle-only reduction; SILU: activations silu(gate) * up;
//   gemv_gguf_f32_lanes_norm<QT,NB,R,L,E>  the same over rms_norm(x + res) * w, which each block
//                                   computes itself (a norm launch fewer); _gated<QT,NB,L,E>: over
//                                   [gate; up], writing silu(gate) * up (the down projection's input);
//   gemv_gguf_f32_staged_silu<QT,NB,R,L,E>  the lanes kernel (L = 0: the block kernel) over
//                                   silu(gate) * up, staged by each block;
//   gemv_gguf_f32_xs<QT,NB,R,WS>    long rows: 128 threads on R rows, the activations staged in
//                                   shared memory chunk by chunk (coalesced cp.async, padded so
//                                   each quarter-warp reads distinct banks) instead of every lane
//                                   reading its own 128 strided bytes of x from L1; WS: the R rows'
//                                   weight bytes of the chunk staged too (16-byte coalesced copies
//                                   instead of ~10 strided 2-4 byte loads per 34-byte Q8_0 block;
//                                   needs bytes per row % 16 == 0).
#include "gguf_units.cuh"
#include "gemv_reduce.cuh"
#include "pdl.cuh"
#ifndef PQ_HOST_SHIM
#include "norm_row.cuh"
#endif

using namespace pq;

#ifndef PQ_HOST_SHIM
PQ_DEV float u2f(u32 u) { return __uint_as_float(u); }
#endif

// int8 -> float without I2F (a quarter-rate conversion): byte k of q ^ 0x80808080 (= value +
// 128) goes into the mantissa of 2^23, then 2^23 + 128 is subtracted. Exact.
#define PQ_I8F(q, k) (u2f(bperm((q), 0x4B000000u, 0x7540u | (k))) - 8388736.0f)

// sum over 16 int8 weights (4 words) times 16 floats (4 float4), and the sum of the floats
PQ_DEV float dot16f(const u32* w, const float4* x, float& xsum) {
    float s = 0.0f, t = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const u32 q = w[i] ^ 0x80808080u;
        const float4 v = x[i];
        s = fmaf(PQ_I8F(q, 0), v.x, s);
        s = fmaf(PQ_I8F(q, 1), v.y, s);
        s = fmaf(PQ_I8F(q, 2), v.z, s);
        s = fmaf(PQ_I8F(q, 3), v.w, s);
        t += (v.x + v.y) + (v.z + v.w);
    }
    xsum = t;
    return s;
}

// Activation loaders: ld(s, i) is float4 i (0..3) of segment s (0: values p0..p0+15, 1: p1..).
struct XSeg {                 // plain activations (global or shared memory)
    const float4 *x0, *x1;
    __device__ __forceinline__ float4 operator()(int s, int i) const { return s ? x1[i] : x0[i]; }
};

struct XSiluMul {             // silu(gate) * up, computed as loaded (the down projection of a gated MLP)
    const float4 *g0, *g1, *u0, *u1;
    __device__ __forceinline__ float4 operator()(int s, int i) const {
        const float4 g = s ? g1[i] : g0[i], u = s ? u1[i] : u0[i];
        return make_float4(silu_mul1(g.x, u.x), silu_mul1(g.y, u.y), silu_mul1(g.z, u.z), silu_mul1(g.w, u.w));
    }
};

// acc[r][n] += unit r (R decoded units of R rows) . the two activation segments of batch column n
// given by the loader ld; one segment's activations are live at a time
template <int QT, int NB, int R, class LD>
PQ_DEV void unit_accum(const Unit (&u)[R], const LD& ld, float (&acc)[R][NB], int n) {
    float s0[R], s1[R], xs0, xs1;
    float4 xv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) xv[i] = ld(0, i);
#pragma unroll
    for (int r = 0; r < R; ++r) s0[r] = dot16f(u[r].w, xv, xs0);
#pragma unroll
    for (int i = 0; i < 4; ++i) xv[i] = ld(1, i);
#pragma unroll
    for (int r = 0; r < R; ++r) s1[r] = dot16f(u[r].w + 4, xv, xs1);
#pragma unroll
    for (int r = 0; r < R; ++r) {
        float v = u[r].a0 * s0[r] + u[r].a1 * s1[r];
        if constexpr (QTraits<QT>::MIN) v += u[r].b0 * xs0 + u[r].b1 * xs1;
        acc[r][n] += v;
    }
}

// unit t of all R rows, dotted with the NB activation rows read straight from x (global or shared memory)
template <int QT, int NB, int R>
PQ_DEV void unit_rows_global(const u8* const (&wr)[R], int t, const u32* tab, const float* __restrict__ x, int K,
                             float (&acc)[R][NB]) {
    constexpr int QK = QTraits<QT>::QK, NSUB = QK / 32;
    const int blk = t / NSUB, sub = t % NSUB;
    Unit u[R];
#pragma unroll
    for (int r = 0; r < R; ++r) decode_at<QT>(wr[r], K / QK, blk, sub, tab, u[r]);
    int p0, p1;
    unit_pos<QT>(sub, p0, p1);
#pragma unroll
    for (int n = 0; n < NB; ++n) {
        const float* xb = x + (long long)n * K + (long long)blk * QK;
        unit_accum<QT, NB, R>(u, XSeg{(const float4*)(xb + p0), (const float4*)(xb + p1)}, acc, n);
    }
}

template <int R, int NB>
PQ_DEV void zero_acc(float (&acc)[R][NB]) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int n = 0; n < NB; ++n) acc[r][n] = 0.0f;
}

struct NoPrologue {
    __device__ __forceinline__ void operator()() const {}
};

// Grid: ceil(rows / R); block: 32-128 threads (fewer for short rows), striding over the units of
// the block's R rows; activation row n at x + n * K. after_wait() runs (the whole block) between
// pdl_wait and the first read of x (x carries no __restrict__: after_wait may write it).
template <int QT, int NB, int R, class AfterWait>
PQ_DEV void f32_block_rows(const u8* __restrict__ W, long long bpr, int rows, int K, const float* x,
                           const float* __restrict__ bias, float* __restrict__ y, const u32* tab,
                           AfterWait after_wait) {
    constexpr int NSUB = QTraits<QT>::QK / 32;
    const int row0 = blockIdx.x * R;
    const u8* wr[R];
    // One prefetch covers the R consecutive rows. Not block_row_ptrs (gguf_units.cuh), here or in
    // gemv_gguf_f32_xs: with its form this kernel at 4 rows took -2.5 to +5% (mostly more; H200, 2026-12-03)
    row_ptrs<R>(W, bpr, row0, rows, wr);
    prefetch_l2(wr[0], bpr * (min(rows, row0 + R) - row0));
    pdl_wait();
    after_wait();
    float acc[R][NB];
    zero_acc<R, NB>(acc);
    const int nunits = (K / QTraits<QT>::QK) * NSUB;
    for (int t = threadIdx.x; t < nunits; t += blockDim.x) unit_rows_global<QT, NB, R>(wr, t, tab, x, K, acc);
    gemv_reduce_store<NB, R>(acc, row0, rows, bias, y);
}

template <int QT, int NB, int R>
__global__ void __launch_bounds__(GEMV_THREADS)
gemv_gguf_f32(const u8* __restrict__ W, long long bpr, int rows, int K, const float* __restrict__ x,
              const float* __restrict__ bias, float* __restrict__ y) {
    constexpr int TAB = QTraits<QT>::TAB;
    __shared__ u32 tab_s[TAB > 0 ? TAB : 1];
    const u32* tab = stage_table<QT>(tab_s);
    f32_block_rows<QT, NB, R>(W, bpr, rows, K, x, bias, y, tab, NoPrologue{});
}

// Units t and t2 (= t + L, or t again past the end: loads stay unconditional) of the R rows
template <int QT, int R, int L>
PQ_DEV void decode_unit_pair(const u8* const (&wr)[R], int t, int nunits, const u32* tab, Unit (&u)[R],
                             Unit (&u2)[R]) {
    constexpr int NSUB = QTraits<QT>::QK / 32;
    const int t2 = t + L < nunits ? t + L : t, nblk = nunits / NSUB;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        decode_at<QT>(wr[r], nblk, t / NSUB, t % NSUB, tab, u[r]);
        decode_at<QT>(wr[r], nblk, t2 / NSUB, t2 % NSUB, tab, u2[r]);
    }
}

// Grid: ceil(rows / (R * 128 / L)); block: 128 threads.  Lane l of a group takes units l,
// l + L, ... two at a time (both units' loads issued before either is used; the first two before
// pdl_wait, since weights are constant: for short rows that is all of them, and only the
// activations' latency follows the kernel before).  Activations: row n at x + n * ldx; SILU:
// silu(x) * up instead (up + n * ldu), the fused SiLU*up of a gated MLP. after_wait() runs
// (the whole block) between pdl_wait and the first read of x. x and up carry no __restrict__ here:
// after_wait may write what x points to (the kernels' own parameters keep theirs).
// GATED (R == 2): the weight is [gate; up] of 2 * rows rows; group i takes rows i and rows + i and
// writes y[n, i] = silu(gate) * up of their sums (bias unused) -- the input of the down projection,
// so that projection needs no SiLU of its own.
template <int QT, int NB, int R, int L, bool SILU, bool GATED = false, class AfterWait>
PQ_DEV void f32_lanes_rows(const u8* __restrict__ W, long long bpr, int rows, int K, const float* x, long long ldx,
                           const float* up, long long ldu, const float* __restrict__ bias, float* __restrict__ y,
                           const u32* tab, AfterWait after_wait) {
    static_assert(L >= 2 && L <= 32 && (L & (L - 1)) == 0, "L: a power of two <= 32");
    static_assert(!GATED || R == 2, "GATED: a gate row and an up row per group");
    constexpr int QK = QTraits<QT>::QK, NSUB = QK / 32;
    const int l = threadIdx.x & (L - 1);
    const int group = blockIdx.x * (GEMV_THREADS / L) + (int)(threadIdx.x / L);
    const int row0 = GATED ? group : group * R;
    const u8* wr[R];
    if constexpr (GATED) {
        wr[0] = W + (long long)min(group, rows - 1) * bpr;
        wr[R - 1] = wr[0] + (long long)rows * bpr;
    } else {
        row_ptrs<R>(W, bpr, row0, rows, wr);
    }
    float acc[R][NB];
    zero_acc<R, NB>(acc);
    const int nunits = (K / QK) * NSUB;
    Unit u[R], u2[R];
    if (l < nunits) decode_unit_pair<QT, R, L>(wr, l, nunits, tab, u, u2);
    pdl_wait();
    after_wait();
    for (int t = l; t < nunits; t += 2 * L) {
        const bool two = t + L < nunits;
        const int t2 = two ? t + L : t;
        const int blk = t / NSUB, sub = t % NSUB, blk2 = t2 / NSUB, sub2 = t2 % NSUB;
        if (t != l) decode_unit_pair<QT, R, L>(wr, t, nunits, tab, u, u2);
        int p[4];
        unit_pos<QT>(sub, p[0], p[1]);
        unit_pos<QT>(sub2, p[2], p[3]);
        const long long o1 = (long long)blk * QK, o2 = (long long)blk2 * QK;
#define PQ_F4(b, o) ((const float4*)((b) + (o)))
#pragma unroll
        for (int n = 0; n < NB; ++n) {
            const float* xb = x + n * ldx;
            if constexpr (SILU) {
                const float* ub = up + n * ldu;
                unit_accum<QT, NB, R>(u, XSiluMul{PQ_F4(xb, o1 + p[0]), PQ_F4(xb, o1 + p[1]), PQ_F4(ub, o1 + p[0]),
                                                  PQ_F4(ub, o1 + p[1])}, acc, n);
                if (two)
                    unit_accum<QT, NB, R>(u2, XSiluMul{PQ_F4(xb, o2 + p[2]), PQ_F4(xb, o2 + p[3]), PQ_F4(ub, o2 + p[2]),
                                                       PQ_F4(ub, o2 + p[3])}, acc, n);
            } else {
                unit_accum<QT, NB, R>(u, XSeg{PQ_F4(xb, o1 + p[0]), PQ_F4(xb, o1 + p[1])}, acc, n);
                if (two) unit_accum<QT, NB, R>(u2, XSeg{PQ_F4(xb, o2 + p[2]), PQ_F4(xb, o2 + p[3])}, acc, n);
            }
        }
#undef PQ_F4
    }
    if constexpr (GATED) {
#pragma unroll
        for (int n = 0; n < NB; ++n) {
            float g = acc[0][n], u = acc[R - 1][n];   // summed as gemv_reduce_lanes_store sums
#pragma unroll
            for (int o = L / 2; o > 0; o >>= 1) {
                g += __shfl_xor_sync(0xffffffffu, g, o);
                u += __shfl_xor_sync(0xffffffffu, u, o);
            }
            if (l == n % L && row0 < rows) y[(long long)n * rows + row0] = silu_mul1(g, u);
        }
    } else {
        gemv_reduce_lanes_store<NB, R, L>(acc, row0, rows, bias, y);
    }
}

template <int QT, int NB, int R, int L, bool SILU>
__global__ void __launch_bounds__(GEMV_THREADS)
gemv_gguf_f32_lanes(const u8* __restrict__ W, long long bpr, int rows, int K, const float* __restrict__ x,
                    long long ldx, const float* __restrict__ up, long long ldu, const float* __restrict__ bias,
                    float* __restrict__ y) {
    constexpr int TAB = QTraits<QT>::TAB;
    __shared__ u32 tab_s[TAB > 0 ? TAB : 1];
    const u32* tab = stage_table<QT>(tab_s);
    f32_lanes_rows<QT, NB, R, L, SILU>(W, bpr, rows, K, x, ldx, up, ldu, bias, y, tab, NoPrologue{});
}

#ifndef PQ_HOST_SHIM
// The input of the lanes GEMV normalised by each block (K <= 32 * E): warp c computes column c's
// h = rms_norm(x + res) * wn into shared memory with the warp-per-row norm's arithmetic (the same
// bits as add_rms_norm), then the lanes read h from there. Block 0 also writes res_out = x + res,
// which therefore must not alias res (the other blocks still read it).
template <int NB, int E>
struct NormInto {
    const float *x, *res, *wn;
    float* res_out;
    float (*h)[32 * E];
    int K;
    float eps;
    __device__ __forceinline__ void operator()() const {
        for (int c = threadIdx.x >> 5; c < NB; c += GEMV_THREADS / 32)
            warp_norm_row<E, true>(x + (long long)c * K, res + (long long)c * K, wn, h[c],
                             blockIdx.x == 0 ? res_out + (long long)c * K : nullptr, K, eps);
        __syncthreads();
    }
};

template <int QT, int NB, int R, int L, int E>
__global__ void __launch_bounds__(GEMV_THREADS)
gemv_gguf_f32_lanes_norm(const u8* __restrict__ W, long long bpr, int rows, int K, const float* __restrict__ x,
                         const float* __restrict__ res, const float* __restrict__ wn, float eps,
                         float* __restrict__ res_out, const float* __restrict__ bias, float* __restrict__ y) {
    constexpr int TAB = QTraits<QT>::TAB;
    __shared__ __align__(16) float h_s[NB][32 * E];
    __shared__ u32 tab_s[TAB > 0 ? TAB : 1];
    const u32* tab = stage_table<QT>(tab_s);
    f32_lanes_rows<QT, NB, R, L, false>(W, bpr, rows, K, &h_s[0][0], 32 * E, nullptr, 0, bias, y, tab,
                                        NormInto<NB, E>{x, res, wn, res_out, h_s, K, eps});
}

// The same over a gated MLP's [gate; up] (2 * inter rows): y [NB, inter] = silu(gate) * up.
template <int QT, int NB, int L, int E>
__global__ void __launch_bounds__(GEMV_THREADS)
gemv_gguf_f32_lanes_norm_gated(const u8* __restrict__ W, long long bpr, int inter, int K,
                               const float* __restrict__ x, const float* __restrict__ res,
                               const float* __restrict__ wn, float eps, float* __restrict__ res_out,
                               float* __restrict__ y) {
    constexpr int TAB = QTraits<QT>::TAB;
    __shared__ __align__(16) float h_s[NB][32 * E];
    __shared__ u32 tab_s[TAB > 0 ? TAB : 1];
    const u32* tab = stage_table<QT>(tab_s);
    f32_lanes_rows<QT, NB, 2, L, false, true>(W, bpr, inter, K, &h_s[0][0], 32 * E, nullptr, 0, nullptr, y, tab,
                                              NormInto<NB, E>{x, res, wn, res_out, h_s, K, eps});
}
#endif

// silu(gate) * up of the NB activation rows computed once per block into shared memory (h, rows of
// K <= 32 * E values; each thread a share of them, float4 at a time) before the dot products read
// it: the fused SILU loader instead has every warp recompute all K values, a serial chain of expf
// and divisions per lane that few warps cannot hide (H200, SmolLM2's 576x1536 down projection: its
// batch-4 decode graph 1,932 -> 1,799 us). A thread issues the loads of up to PER float4s of gate
// and up before it computes and stores any (a loop of load-compute-store paid one L2 round trip
// per float4: the compiler may not move a global load above a store through h). Same expression,
// same order of the dot products, so the same bits. gate / up rows 16-byte aligned.
template <int NB, int E>
struct SiluMulInto {
    const float *g, *u;
    long long ldg, ldu;
    float* h;
    int K;
    __device__ __forceinline__ void operator()() const {
        constexpr int SLOTS = (NB * 8 * E + GEMV_THREADS - 1) / GEMV_THREADS;   // float4s a thread, all rows
        constexpr int PER = SLOTS < 4 ? SLOTS : 4;
        const int k4 = K / 4, n4 = NB * k4;
        for (int i0 = threadIdx.x; i0 < n4; i0 += PER * blockDim.x) {
            float4 gv[PER], uv[PER];
#pragma unroll
            for (int e = 0; e < PER; ++e) {
                const int i = i0 + e * blockDim.x, c = i / k4, j = i - c * k4;
                if (i < n4) {
                    gv[e] = ((const float4*)(g + c * ldg))[j];
                    uv[e] = ((const float4*)(u + c * ldu))[j];
                }
            }
#pragma unroll
            for (int e = 0; e < PER; ++e) {
                const int i = i0 + e * blockDim.x;
                if (i < n4)
                    ((float4*)h)[i] = make_float4(silu_mul1(gv[e].x, uv[e].x), silu_mul1(gv[e].y, uv[e].y),
                                                  silu_mul1(gv[e].z, uv[e].z), silu_mul1(gv[e].w, uv[e].w));
            }
        }
        __syncthreads();
    }
};

// The lanes kernel (L lanes a row group) or, with L == 0, the block kernel (gemv_gguf_f32) over
// silu(gate) * up staged by SiluMulInto (K <= 32 * E).
template <int QT, int NB, int R, int L, int E>
__global__ void __launch_bounds__(GEMV_THREADS)
gemv_gguf_f32_staged_silu(const u8* __restrict__ W, long long bpr, int rows, int K, const float* __restrict__ g,
                          long long ldg, const float* __restrict__ u, long long ldu, const float* __restrict__ bias,
                          float* __restrict__ y) {
    constexpr int TAB = QTraits<QT>::TAB;
    __shared__ __align__(16) float h_s[NB * 32 * E];
    __shared__ u32 tab_s[TAB > 0 ? TAB : 1];
    const u32* tab = stage_table<QT>(tab_s);
    const SiluMulInto<NB, E> stage{g, u, ldg, ldu, h_s, K};
    if constexpr (L > 0)
        f32_lanes_rows<QT, NB, R, L, false>(W, bpr, rows, K, h_s, K, nullptr, 0, bias, y, tab, stage);
    else
        f32_block_rows<QT, NB, R>(W, bpr, rows, K, h_s, bias, y, tab, stage);
}

// --- x staged in shared memory --------------------------------------------------------------
PQ_DEV void cp_async16_pq(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const u32 s = (u32)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
#else
    *(float4*)smem = *(const float4*)gmem;
#endif
}

PQ_DEV void cp_async_wait_all_pq() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
    asm volatile("cp.async.wait_group 0;\n" ::);
#endif
}

// Padded float4 index: one float4 of padding after every 2^S float4.  A quarter-warp reading
// its 8 units' segments then hits 8 distinct 16-byte bank groups: S = 3 for the types whose
// units are 32 consecutive values, S = 4 for Q4_K / Q5_K (units of two 16-value halves 32 apart).
template <int QT> struct XPad { enum { S = (QT == Q4_K || QT == Q5_K) ? 4 : 3 }; };
constexpr int XS_CHUNK_F4 = GEMV_THREADS * 8;        // float4 of one column per chunk (128 units)

template <int QT> PQ_DEV int xpad(int q) { return q + (q >> XPad<QT>::S); }

// Grid: ceil(rows / R); block: exactly 128 threads.  Chunk c covers units [128c, 128c + 128),
// one per thread; NBS batch columns are staged at a time (all NB when NB <= 2 and the weights
// are not staged).
template <int QT, int NB, int R, bool WS>
__global__ void __launch_bounds__(GEMV_THREADS)
gemv_gguf_f32_xs(const u8* __restrict__ W, long long bpr, int rows, int K, const float* __restrict__ x,
                 const float* __restrict__ bias, float* __restrict__ y) {
    constexpr int QK = QTraits<QT>::QK, NSUB = QK / 32, TAB = QTraits<QT>::TAB;
    constexpr int NBS = NB <= 2 && !WS ? NB : 1;
    constexpr int XF4 = XS_CHUNK_F4 + (XS_CHUNK_F4 >> XPad<QT>::S);
    constexpr int CB = GEMV_THREADS / NSUB, CHB = CB * BLOCK_ROW_BYTES<QT>;   // blocks, bytes of a row's chunk (16k)
    static_assert((GEMV_THREADS / 32 - 1) * R * NB * 32 <= NBS * XF4 * 4, "reduction scratch fits in xs");
    static_assert(NBS * XF4 * 16 + (WS ? R * CHB : 0) + 4 * TAB <= 48 * 1024, "static shared memory");
    __shared__ __align__(16) float4 xs[NBS * XF4];
    __shared__ __align__(16) u8 ws_s[WS ? R * CHB : 16];
    __shared__ u32 tab_s[TAB > 0 ? TAB : 1];
    const u32* tab = stage_table<QT>(tab_s);
    const int row0 = blockIdx.x * R;
    const u8* wr[R];
    row_ptrs<R>(W, bpr, row0, rows, wr);
    prefetch_l2(wr[0], bpr * (min(rows, row0 + R) - row0));
    pdl_wait();
    float acc[R][NB];
    zero_acc<R, NB>(acc);
    const int nunits = (K / QK) * NSUB;
    for (int c0 = 0; c0 < nunits; c0 += GEMV_THREADS) {
        const int t = c0 + threadIdx.x;
        const bool active = t < nunits;
        const int tt = active ? t : c0;
        const int blk = tt / NSUB, sub = tt % NSUB;
        int p0, p1;
        unit_pos<QT>(sub, p0, p1);
        const int rel = (blk - c0 / NSUB) * QK;        // the unit's block, in floats from the chunk start
        const int q0 = xpad<QT>((rel + p0) >> 2), q1 = xpad<QT>((rel + p1) >> 2);
        const int nq = min(XS_CHUNK_F4, (K - c0 * 32) >> 2);
        Unit u[R];
#pragma unroll
        for (int g = 0; g < NB; g += NBS) {
            __syncthreads();                           // the previous readers of xs / ws_s are done
            if (g == 0) {
                if constexpr (WS) {                    // rows end 16-byte aligned: rounding up stays in the row
                    const int n16 = (min(GEMV_THREADS, nunits - c0) / NSUB * BLOCK_ROW_BYTES<QT> + 15) >> 4;
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        const u8* src = block_at<QT>(wr[r], c0 / NSUB);
                        for (int i = threadIdx.x; i < n16; i += GEMV_THREADS)
                            cp_async16_pq(ws_s + r * CHB + 16 * i, src + 16 * i);
                    }
                } else {
#pragma unroll
                    for (int r = 0; r < R; ++r) decode_at<QT>(wr[r], K / QK, blk, sub, tab, u[r]);
                }
            }
#pragma unroll
            for (int s = 0; s < NBS; ++s) {
                const float* xc = x + (long long)(g + s) * K + (long long)c0 * 32;
#pragma unroll
                for (int k = 0; k < XS_CHUNK_F4 / GEMV_THREADS; ++k) {
                    const int q = threadIdx.x + k * GEMV_THREADS;
                    if (q < nq) cp_async16_pq(&xs[s * XF4 + xpad<QT>(q)], xc + 4 * q);
                }
            }
            cp_async_wait_all_pq();
            __syncthreads();
            if constexpr (WS) {
                if (g == 0) {
                    const int cblk = min(CB, K / QK - c0 / NSUB);   // the chunk's blocks (runs of 8 from its start)
#pragma unroll
                    for (int r = 0; r < R; ++r) decode_at<QT>(ws_s + r * CHB, cblk, blk - c0 / NSUB, sub, tab, u[r]);
                }
            }
            if (active) {
#pragma unroll
                for (int s = 0; s < NBS; ++s)
                    unit_accum<QT, NB, R>(u, XSeg{&xs[s * XF4 + q0], &xs[s * XF4 + q1]}, acc, g + s);
            }
        }
    }
    __syncthreads();                                   // xs becomes the reduction scratch
    gemv_reduce_store_to<NB, R>(acc, row0, rows, bias, y, (float*)xs);
}

#ifndef __CUDACC_RTC__
// nvcc's compile check (tests/test_cuda_compile.py): every decoder through one kernel shape, every
// shape for a type of each family (their code depends on the type only through decode<QT>; all
// shapes for all 14 types (now 20) took 3.3 minutes of the CI machine's 2 cores for the 5 architectures).
#define PQ_INST_DECODE(T)                                                                               \
    template __global__ void gemv_gguf_f32_lanes<T, 1, 2, 16, false>(                                 \
        const u8*, long long, int, int, const float*, long long, const float*, long long, const float*, float*);
#define PQ_INST_SHAPES(T)                                                                               \
    template __global__ void gemv_gguf_f32<T, 2, 4>(const u8*, long long, int, int, const float*,     \
                                                    const float*, float*);                            \
    template __global__ void gemv_gguf_f32_lanes<T, 2, 2, 32, true>(                                  \
        const u8*, long long, int, int, const float*, long long, const float*, long long, const float*, float*); \
    template __global__ void gemv_gguf_f32_xs<T, 2, 4, false>(const u8*, long long, int, int,          \
                                                              const float*, const float*, float*);   \
    template __global__ void gemv_gguf_f32_xs<T, 1, 4, true>(const u8*, long long, int, int,           \
                                                             const float*, const float*, float*);   \
    template __global__ void gemv_gguf_f32_lanes_norm<T, 1, 2, 16, 32>(                               \
        const u8*, long long, int, int, const float*, const float*, const float*, float, float*, const float*, float*); \
    template __global__ void gemv_gguf_f32_lanes_norm_gated<T, 1, 16, 32>(                             \
        const u8*, long long, int, int, const float*, const float*, const float*, float, float*, float*); \
    template __global__ void gemv_gguf_f32_staged_silu<T, 1, 2, 32, 48>(                              \
        const u8*, long long, int, int, const float*, long long, const float*, long long, const float*, float*); \
    template __global__ void gemv_gguf_f32_staged_silu<T, 1, 2, 0, 48>(                               \
        const u8*, long long, int, int, const float*, long long, const float*, long long, const float*, float*);
PQ_INST_DECODE(Q4_0) PQ_INST_DECODE(Q4_1) PQ_INST_DECODE(Q5_0) PQ_INST_DECODE(Q5_1) PQ_INST_DECODE(Q8_0)
PQ_INST_DECODE(Q2_K) PQ_INST_DECODE(Q3_K) PQ_INST_DECODE(Q4_K) PQ_INST_DECODE(Q5_K) PQ_INST_DECODE(Q6_K)
PQ_INST_DECODE(Q6_KR) PQ_INST_DECODE(IQ2_XXS) PQ_INST_DECODE(IQ2_XS) PQ_INST_DECODE(IQ2_S) PQ_INST_DECODE(IQ3_XXS)
PQ_INST_DECODE(IQ3_S) PQ_INST_DECODE(IQ4_NL) PQ_INST_DECODE(IQ4_XS) PQ_INST_DECODE(IQ1_S) PQ_INST_DECODE(IQ1_M)
PQ_INST_SHAPES(Q4_1) PQ_INST_SHAPES(Q8_0) PQ_INST_SHAPES(Q4_K) PQ_INST_SHAPES(Q6_KR) PQ_INST_SHAPES(IQ2_XXS)
#undef PQ_INST_SHAPES
#undef PQ_INST_DECODE
#endif
