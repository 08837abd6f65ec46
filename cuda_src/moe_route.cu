// Mixture-of-experts routing on the device. NumPy references: NumpyOps.moe_route_softmax and
// moe_route (pocketcupy/backend/ops_ref.py).
#include "common.cuh"

// The index (lowest among equals) and value of the largest of the warp's (v, i); every lane gets them.
__device__ __forceinline__ void warp_argmax(float& v, int& i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(PC_FULL_MASK, v, o);
        const int oi = __shfl_xor_sync(PC_FULL_MASK, i, o);
        if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
    }
}

// The largest of row[0:E] (the lowest index among equals; E where every value is -inf), struck out
// of row: its index, and its value in v. The whole warp calls it.
__device__ __forceinline__ int warp_take_max(float* row, int E, float& v) {
    const int lane = threadIdx.x & 31;
    v = pc_neg_inf();
    int i = E;
    for (int e = lane; e < E; e += PC_WARP) {
        if (row[e] > v) v = row[e], i = e;
    }
    warp_argmax(v, i);
    __syncwarp();
    if (lane == 0 && i < E) row[i] = pc_neg_inf();
    __syncwarp();
    return i;
}

// Qwen3-Next's router: softmax over a row of logits [N, E] (row stride `stride`), its K largest
// probabilities (the lower expert id first among equals), renormalised to sum 1 where `norm`.
// weights [N, K] float32, ids [N, K] int32. grid N, block 32 (a warp a row), K <= 32, dynamic
// shared memory E floats (the row's logits; each pick is struck out).
extern "C" __global__ void moe_topk_softmax_f32(const float* __restrict__ logits, i64 stride, int E, int K, int norm,
                                                float* __restrict__ weights, int* __restrict__ ids) {
    extern __shared__ float row[];
    pdl_wait();
    const i64 n = blockIdx.x;
    const int lane = threadIdx.x;
    float m = pc_neg_inf();
    for (int e = lane; e < E; e += PC_WARP) {
        row[e] = logits[n * stride + e];
        m = fmaxf(m, row[e]);
    }
    m = warp_max(m);
    float sum = 0.0f;
    for (int e = lane; e < E; e += PC_WARP) sum += expf(row[e] - m);
    sum = warp_sum(sum);
    __syncwarp();
    float mine_w = 0.0f, total = 0.0f;
    int mine_id = 0;
    for (int k = 0; k < K; ++k) {
        float bv;
        const int bi = warp_take_max(row, E, bv);
        const float w = expf(bv - m) / sum;
        total += w;
        if (lane == k) mine_w = w, mine_id = bi;
    }
    if (lane < K) {
        weights[n * K + lane] = norm ? mine_w / total : mine_w;
        ids[n * K + lane] = mine_id;
    }
}

// DeepSeek-V3's router (noaux_tc; NumPy reference NumpyOps.moe_route): sigmoid scores of a row of
// logits [N, E] (row stride `stride`); choice = score + bias; the topk_group of n_group groups whose
// two best choices sum highest; the K best choices within them (struck out as picked); weights the
// unbiased scores, normalised to sum 1 where `norm`, times `scaling`. weights [N, K] float32, ids
// [N, K] int32. grid N, block 32 (a warp a row: lane g holds group g's sum), n_group <= 32, K <= 32,
// dynamic shared memory 2 E floats.
extern "C" __global__ void moe_topk_sigmoid_group_f32(const float* __restrict__ logits, i64 stride,
                                                      const float* __restrict__ bias, int E, int n_group,
                                                      int topk_group, int K, int norm, float scaling,
                                                      float* __restrict__ weights, int* __restrict__ ids) {
    extern __shared__ float route_smem[];
    float* score = route_smem;
    float* choice = route_smem + E;
    pdl_wait();
    const i64 n = blockIdx.x;
    const int lane = threadIdx.x, per_group = E / n_group;
    for (int e = lane; e < E; e += PC_WARP) {
        const float s = 1.0f / (1.0f + expf(-logits[n * stride + e]));
        score[e] = s;
        choice[e] = s + bias[e];
    }
    __syncwarp();
    float group = pc_neg_inf();
    if (lane < n_group) {
        float b1 = pc_neg_inf(), b2 = pc_neg_inf();
        for (int i = 0; i < per_group; ++i) {
            const float v = choice[lane * per_group + i];
            if (v > b1) b2 = b1, b1 = v;
            else if (v > b2) b2 = v;
        }
        group = b2 + b1;
    }
    unsigned allowed = 0u;
    for (int k = 0; k < topk_group; ++k) {
        float v = group;
        int i = lane < n_group ? lane : PC_WARP;
        warp_argmax(v, i);
        if (i < n_group) allowed |= 1u << i;
        if (lane == i) group = pc_neg_inf();
    }
    for (int e = lane; e < E; e += PC_WARP) {
        if (!((allowed >> (e / per_group)) & 1u)) choice[e] = pc_neg_inf();
    }
    __syncwarp();
    float mine_w = 0.0f, total = 0.0f;
    int mine_id = 0;
    for (int k = 0; k < K; ++k) {
        float bv;
        const int bi = warp_take_max(choice, E, bv);
        const float w = bi < E ? score[bi] : 0.0f;
        total += w;
        if (lane == k) mine_w = w, mine_id = bi;
    }
    if (lane < K) {
        weights[n * K + lane] = (norm ? mine_w / (total + 1e-20f) : mine_w) * scaling;
        ids[n * K + lane] = mine_id;
    }
}
