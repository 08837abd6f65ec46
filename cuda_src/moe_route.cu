// Mixture-of-experts routing on the device. NumPy reference: NumpyOps.moe_route_softmax
// (pocketcupy/backend/ops_ref.py).
#include "common.cuh"

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
        float bv = pc_neg_inf();
        int bi = E;
        for (int e = lane; e < E; e += PC_WARP) {
            if (row[e] > bv) bv = row[e], bi = e;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(PC_FULL_MASK, bv, o);
            const int oi = __shfl_xor_sync(PC_FULL_MASK, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        }
        __syncwarp();
        if (lane == 0 && bi < E) row[bi] = pc_neg_inf();
        __syncwarp();
        const float w = expf(bv - m) / sum;
        total += w;
        if (lane == k) mine_w = w, mine_id = bi;
    }
    if (lane < K) {
        weights[n * K + lane] = norm ? mine_w / total : mine_w;
        ids[n * K + lane] = mine_id;
    }
}
