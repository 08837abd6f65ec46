// Gated DeltaNet (Qwen3-Next / Qwen3.5 linear attention) over a flat batch of sequences: the causal
// depthwise conv with SiLU, the per-token gates and q/k normalisation, and the gated delta rule's
// recurrence. Sequence b owns rows query_start[b]..query_start[b+1] of the batch and its states at
// row slots[b] of the state arrays (read at the start, written back at the end), so prefill chunks
// and decode rows mix in one launch, and the launches read no device value on the host (graphs).
// NumPy reference: NumpyOps.causal_conv1d_silu / gated_delta_rule (pocketcupy/backend/ops_ref.py).
#include "common.cuh"

#define CONV_MAX_K 8

// x [N, C] (row stride x_stride); w [C, K]; states [S, C, K - 1] (a sequence's inputs at the K - 1
// positions before this step's, oldest first); out [N, C] = silu(conv). K <= CONV_MAX_K.
// grid (ceil(C / blockDim.x), sequences), a thread a channel of a sequence, its tokens in order.
extern "C" __global__ void causal_conv1d_silu_f32(const float* __restrict__ x, i64 x_stride,
                                                  const float* __restrict__ w, float* __restrict__ states,
                                                  const i64* __restrict__ slots, const int* __restrict__ query_start,
                                                  float* __restrict__ out, int C, int K) {
    pdl_wait();
    const int c = blockIdx.x * blockDim.x + threadIdx.x, b = blockIdx.y;
    if (c >= C) return;
    float win[CONV_MAX_K - 1], wk[CONV_MAX_K - 1];    // the window's weights; wlast the new input's
    float* st = states + (slots[b] * C + c) * (K - 1);
#pragma unroll
    for (int j = 0; j < CONV_MAX_K - 1; ++j) {
        wk[j] = j < K - 1 ? w[(i64)c * K + j] : 0.0f;
        win[j] = j < K - 1 ? st[j] : 0.0f;
    }
    const float wlast = w[(i64)c * K + K - 1];
    const int t0 = query_start[b], t1 = query_start[b + 1];
#pragma unroll 4     // a prefill's loads of the next tokens go out before this one's sum
    for (int t = t0; t < t1; ++t) {
        const float xt = x[(i64)t * x_stride + c];
        float acc = xt * wlast;
#pragma unroll
        for (int j = 0; j < CONV_MAX_K - 1; ++j) acc += win[j] * wk[j];   // zero weights past K - 1
#pragma unroll
        for (int j = 0; j < CONV_MAX_K - 1; ++j) {
            if (j < K - 2) win[j] = win[j + 1];
            else if (j == K - 2) win[j] = xt;
        }
        out[(i64)t * C + c] = acc / (1.0f + expf(-acc));
    }
#pragma unroll
    for (int j = 0; j < CONV_MAX_K - 1; ++j) {
        if (j < K - 1) st[j] = win[j];
    }
}

// The gated delta rule's inputs per token: qn, kn [N, Hk, Dk] the L2-normalised q and k (q also
// times Dk^-1/2; q, k rows at row strides q_stride, k_stride), and per value head beta [N, Hv] =
// sigmoid(b) and decay [N, Hv] = exp(-exp(a_log) softplus(a + dt_bias)) (b, a at row strides
// b_stride, a_stride). grid (N, 2 Hk + 1), block 32: a warp normalises one head of q or of k; the
// last warp of a token computes its gates.
extern "C" __global__ void gdn_prepare_f32(const float* __restrict__ q, i64 q_stride, const float* __restrict__ k,
                                           i64 k_stride, const float* __restrict__ b, i64 b_stride,
                                           const float* __restrict__ a, i64 a_stride,
                                           const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                                           float* __restrict__ qn, float* __restrict__ kn,
                                           float* __restrict__ beta, float* __restrict__ decay,
                                           int Hk, int Dk, int Hv) {
    pdl_wait();
    const i64 t = blockIdx.x;
    const int y = blockIdx.y, lane = threadIdx.x;
    if (y == 2 * Hk) {
        for (int h = lane; h < Hv; h += PC_WARP) {
            const float bt = b[t * b_stride + h], x = a[t * a_stride + h] + dt_bias[h];
            const float softplus = x > 20.0f ? x : log1pf(expf(fminf(x, 20.0f)));   // torch's threshold
            beta[t * Hv + h] = 1.0f / (1.0f + expf(-bt));
            decay[t * Hv + h] = expf(-expf(a_log[h]) * softplus);
        }
        return;
    }
    const bool is_q = y < Hk;
    const int head = is_q ? y : y - Hk;
    const float* src = is_q ? q + t * q_stride + (i64)head * Dk : k + t * k_stride + (i64)head * Dk;
    float* dst = (is_q ? qn : kn) + (t * Hk + head) * Dk;
    float ss = 0.0f;
    for (int i = lane; i < Dk; i += PC_WARP) ss += src[i] * src[i];
    ss = warp_sum(ss);
    float scale = rsqrtf(ss + 1e-6f);
    if (is_q) scale *= rsqrtf((float)Dk);
    for (int i = lane; i < Dk; i += PC_WARP) dst[i] = src[i] * scale;
}

// The recurrence S = decay S; S += k (beta (v - k S))^T; out = q S per token, from the state at
// slots[b] ([S, Hv, Dk, Dv] float32), written back after the sequence's last token. qn, kn, beta,
// decay from gdn_prepare_f32; v [N, Hv, Dv] rows at v_stride; out [N, Hv, Dv]. Value head h reads
// key head h / (Hv / Hk). Dk = 4 R: a state column j is held by 4 neighbouring lanes, R rows each
// in registers, so the dot products over Dk are a thread's R products and two shuffles and no
// barrier is needed. grid (ceil(Dv / (blockDim.x / 4)), Hv, sequences), blockDim.x a multiple of 32.
template <int R>
__global__ void gated_delta_rule_f32(const float* __restrict__ qn, const float* __restrict__ kn,
                                     const float* __restrict__ v, i64 v_stride, const float* __restrict__ beta,
                                     const float* __restrict__ decay, float* __restrict__ states,
                                     const i64* __restrict__ slots, const int* __restrict__ query_start,
                                     float* __restrict__ out, int Hk, int Hv, int Dv) {
    constexpr int DK = 4 * R;
    pdl_wait();
    const int lane = threadIdx.x & 31, part = lane & 3;
    const int j = blockIdx.x * (blockDim.x >> 2) + (threadIdx.x >> 5) * 8 + (lane >> 2);
    const int h = blockIdx.y, b = blockIdx.z, hk = h / (Hv / Hk);
    const bool live = j < Dv;
    float* st = states + (slots[b] * Hv + h) * (i64)DK * Dv + (i64)part * R * Dv + j;
    float s[R];
#pragma unroll
    for (int r = 0; r < R; ++r) s[r] = live ? st[(i64)r * Dv] : 0.0f;
    const int t0 = query_start[b], t1 = query_start[b + 1];
#pragma unroll 2     // the next token's loads overlap this one's products
    for (int t = t0; t < t1; ++t) {
        const float* kt = kn + ((i64)t * Hk + hk) * DK + part * R;
        const float* qt = qn + ((i64)t * Hk + hk) * DK + part * R;
        float kv[R];
        float ks = 0.0f;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            kv[r] = kt[r];
            ks += kv[r] * s[r];
        }
        ks += __shfl_xor_sync(PC_FULL_MASK, ks, 1);
        ks += __shfl_xor_sync(PC_FULL_MASK, ks, 2);
        const float dec = decay[(i64)t * Hv + h];
        const float vj = live ? v[(i64)t * v_stride + (i64)h * Dv + j] : 0.0f;
        const float delta = beta[(i64)t * Hv + h] * (vj - dec * ks);
        float o = 0.0f;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            s[r] = dec * s[r] + kv[r] * delta;
            o += qt[r] * s[r];
        }
        o += __shfl_xor_sync(PC_FULL_MASK, o, 1);
        o += __shfl_xor_sync(PC_FULL_MASK, o, 2);
        if (live && part == 0) out[((i64)t * Hv + h) * Dv + j] = o;
    }
    if (live) {
#pragma unroll
        for (int r = 0; r < R; ++r) st[(i64)r * Dv] = s[r];
    }
}
