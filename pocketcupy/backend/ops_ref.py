"""The NumPy reference backend: float32 math, paged KV cache, every op the models use.
Each CUDA op is checked against the op of the same name here."""
from __future__ import annotations

import numpy as np

from ..quant.act_q8 import Q8ActWeight, check_mode, q8_roundtrip, uses_q8
from ..quant.kv_quant import KV_CACHE_DTYPES, KV_KINDS, QuantKVCache
from ..quant.qtensor import QTensor
from .attention_meta import AttentionMetadata

# query rows of one sequence that paged_attention scores at a time: each chunk against only the keys
# its last row sees, its scores small enough to stay in cache
QUERY_CHUNK = 128


class NumpyOps:
    name = "cpu"
    xp = np
    kv_dtype_bytes = 4  # float32 KV cache ("auto")
    kv_cache_dtypes = KV_CACHE_DTYPES

    def __init__(self, quant_activations: str = "auto"):
        self.quant_activations = check_mode(quant_activations)

    # --- data movement -------------------------------------------------------------------
    def weight(self, t: QTensor) -> np.ndarray:
        """A stored weight in the form `linear`/`embedding` consume: float32 here (a Q8ActWeight
        where its linears take int8-rounded activations, see quant/act_q8.py)."""
        w = t.dequantize()
        if w.ndim == 2 and uses_q8(t.qtype, w.shape[1], self.quant_activations):
            return w.view(Q8ActWeight)
        return w

    def mla_weight(self, t: QTensor) -> np.ndarray:
        """kv_b_proj (DeepSeek's MLA) as mla_attention takes it: float32."""
        return t.dequantize()

    def concat_rows(self, ws):
        """One weight (or bias) whose rows are those of ws in order: fused QKV / gate+up
        projections whose outputs are split by column views. None if the parts cannot be joined."""
        if any(w is None for w in ws) or len({w.shape[1:] for w in ws}) != 1:
            return None
        kinds = {isinstance(w, Q8ActWeight) for w in ws}
        if len(kinds) != 1:
            return None
        joined = np.concatenate([np.asarray(w) for w in ws], axis=0)
        return joined.view(Q8ActWeight) if kinds == {True} else joined

    def asarray(self, a, dtype=None):
        return np.asarray(a, dtype=dtype)

    def check_config(self, config) -> None:
        """A ValueError naming the field where the backend has no kernel for a model's sizes (none
        here: NumPy takes any)."""

    def to_host(self, a) -> np.ndarray:
        return np.asarray(a)

    def argmax_rows(self, x) -> np.ndarray:
        """The first index of each row's maximum, on the host."""
        return np.asarray(x).argmax(axis=1)

    def scatter_tokens(self, ids, dst_rows, tokens, src_rows) -> None:
        """ids[dst_rows] = tokens[src_rows] in place (the previous step's sampled ids)."""
        ids[list(dst_rows)] = np.asarray(tokens)[list(src_rows)]

    def upload_meta(self, meta: AttentionMetadata) -> AttentionMetadata:
        """Attention metadata where the attention op reads it (host memory here)."""
        return meta

    def empty_kv_cache(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                       dtype: str = "auto", values: bool = True):
        """One layer's K and V pages (V None where not values): float32, or QuantKVCache codes and
        scales (quant/kv_quant.py)."""
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        kinds = (None, None) if dtype == "auto" else KV_KINDS[dtype]
        pages = [np.zeros(shape, np.float32) if kind is None else QuantKVCache.zeros(shape, kind)
                 for kind in kinds[:1 + values]]
        return pages[0], pages[1] if values else None

    # --- elementwise / normalisation -----------------------------------------------------
    def embedding(self, table: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return np.asarray(table)[ids]

    def rms_norm(self, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        var = np.mean(x * x, axis=-1, keepdims=True)
        return (x / np.sqrt(var + eps)) * w

    def add_rms_norm(self, x, residual, w, eps, feeds=None):
        """residual += x; return (rms_norm(residual), residual). feeds: the weights that read the
        output (the CUDA backend quantizes it in the same kernel for int8-activation linears)."""
        residual = x + residual
        return self.rms_norm(residual, w, eps), residual

    def add_rms_norm_linear(self, x, residual, w_norm, eps, w, bias=None):
        """(linear(h, w, bias), residual') for h, residual' = add_rms_norm(x, residual, w_norm, eps)
        (one launch on the CUDA backend where the GEMV can normalise its input)."""
        h, residual = self.add_rms_norm(x, residual, w_norm, eps, feeds=[w])
        return self.linear(h, w, bias), residual

    def linear_add_rms_norm(self, x, w, residual, w_norm, eps, feeds, up=None):
        """add_rms_norm(linear(x, w), residual, ...) in the GEMV's launch (with up: of silu(x) * up),
        or None where the backend does not fuse them: here never (the CUDA backend's batch-1 K-quant
        and Q8_0 GEMVs do); the model then runs the two ops."""
        return None

    def add_rms_norm_mlp(self, x, residual, w_norm, eps, w_gate_up, w_down):
        """(silu_mul_linear(gate, up, w_down), residual') for [gate; up], residual' =
        add_rms_norm_linear(x, residual, w_norm, eps, w_gate_up): a gated MLP over a joined
        gate / up weight (the CUDA backend writes silu(gate) * up from the GEMV where it can)."""
        gu, residual = self.add_rms_norm_linear(x, residual, w_norm, eps, w_gate_up)
        inter = gu.shape[1] // 2
        return self.silu_mul_linear(gu[:, :inter], gu[:, inter:], w_down), residual

    def silu_mul(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return gate / (1.0 + np.exp(-gate)) * up

    def sigmoid_mul(self, gate: np.ndarray, x: np.ndarray) -> np.ndarray:
        """x * sigmoid(gate): an output gate (gate [N, 1] scales each row alike)."""
        return x / (1.0 + np.exp(-gate))

    def linear(self, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        if isinstance(w, Q8ActWeight):
            x = q8_roundtrip(x).astype(x.dtype, copy=False)
        # W x^T, not x W^T: OpenBLAS multiplies a few rows 1.6-2.7 times faster so (SmolLM2's shapes, one
        # thread, 2-32 rows; the same at 1 row); the result is a transposed view
        y = (np.asarray(w) @ x.T).T
        return y + bias if bias is not None else y

    def linears(self, x: np.ndarray, ws, biases=None) -> list[np.ndarray]:
        """[linear(x, w, b) ...]: the projections of one input (one quantization of x on CUDA)."""
        return [self.linear(x, w, b) for w, b in zip(ws, biases or [None] * len(ws))]

    def silu_mul_linear(self, gate: np.ndarray, up: np.ndarray, w: np.ndarray) -> np.ndarray:
        """linear(silu_mul(gate, up), w): the down projection of a gated MLP."""
        return self.linear(self.silu_mul(gate, up), w)

    def rope(self, x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray, interleaved: bool) -> np.ndarray:
        """x [N, H, head_dim]; rotates the first 2*len(inv_freq) dims of each head."""
        rot = 2 * len(inv_freq)
        ang = positions.astype(np.float32)[:, None] * inv_freq[None, :]          # [N, rot/2]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        out = x.copy()
        if interleaved:
            a, b = x[..., 0:rot:2], x[..., 1:rot:2]
            out[..., 0:rot:2] = a * cos - b * sin
            out[..., 1:rot:2] = b * cos + a * sin
        else:
            half = rot // 2
            a, b = x[..., :half], x[..., half:rot]
            out[..., :half] = a * cos - b * sin
            out[..., half:rot] = b * cos + a * sin
        return out

    # --- attention -----------------------------------------------------------------------
    def store_kv(self, k_cache, v_cache, k, v, slot_mapping):
        _store_rows(k_cache, k, slot_mapping)
        _store_rows(v_cache, v, slot_mapping)

    def rope_store_kv(self, q, k, v, positions, inv_freq, interleaved: bool, k_cache, v_cache, slot_mapping):
        """rope(q), rope(k); k (rotated) and v written to the paged cache; returns the rotated q."""
        q = self.rope(q, positions, inv_freq, interleaved)
        k = self.rope(k, positions, inv_freq, interleaved)
        self.store_kv(k_cache, v_cache, k, v, slot_mapping)
        return q

    def attention(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> np.ndarray:
        """Writes k, v of the new tokens into the paged cache, then causal attention of every
        query row over its sequence's cached context. q [N, Hq, D], k/v [N, Hkv, D]."""
        self.store_kv(k_cache, v_cache, k, v, meta.slot_mapping)
        return self.paged_attention(q, k_cache, v_cache, meta, scale)

    def rope_attention(self, q, k, v, positions, inv_freq, interleaved: bool, k_cache, v_cache,
                       meta: AttentionMetadata, scale: float, feeds=None) -> np.ndarray:
        """RoPE on q and k, k and v of the new tokens into the cache, then paged_attention."""
        q = self.rope_store_kv(q, k, v, positions, inv_freq, interleaved, k_cache, v_cache, meta.slot_mapping)
        return self.paged_attention(q, k_cache, v_cache, meta, scale, feeds)

    def paged_attention(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float, feeds=None) -> np.ndarray:
        """Causal attention of every query row q [N, Hq, D] over its sequence's context, all of it
        (the new tokens included) already in the paged cache. feeds (the weights that read the
        output; the CUDA backend quantizes for them): the output as [N, Hq * D] rows."""
        n_tok, hq, d = q.shape
        hkv = k_cache.shape[2]
        g = hq // hkv
        bs = meta.block_size
        out = np.empty_like(q)
        for b in range(meta.num_seqs):
            q0, q1 = int(meta.query_start[b]), int(meta.query_start[b + 1])
            ctx, nq = int(meta.seq_lens[b]), q1 - q0
            nblk = (ctx + bs - 1) // bs
            slots = (meta.block_tables[b, :nblk, None].astype(np.int64) * bs + np.arange(bs)).reshape(-1)[:ctx]
            kt = _cache_rows(k_cache, slots).transpose(1, 2, 0)                  # [Hkv, D, ctx]
            vt = _cache_rows(v_cache, slots).transpose(1, 0, 2)                  # [Hkv, ctx, D]
            qq = q[q0:q1].reshape(nq, hkv, g, d).transpose(1, 2, 0, 3)            # [Hkv, g, nq, D]
            # per KV head, its g query heads' rows as one matrix (BLAS products; np.einsum loops in
            # C), QUERY_CHUNK query rows at a time over the keys the chunk's last row sees
            for c0 in range(0, nq, QUERY_CHUNK):
                m = min(nq, c0 + QUERY_CHUNK) - c0
                keys = ctx - nq + c0 + m
                s = (qq[:, :, c0:c0 + m].reshape(hkv, g * m, d) @ kt[:, :, :keys]).reshape(hkv, g, m, keys)
                s *= scale
                qpos = ctx - nq + c0 + np.arange(m)
                s[..., np.arange(keys)[None, :] > qpos[:, None]] = -np.inf
                s -= s.max(axis=-1, keepdims=True)
                np.exp(s, out=s)
                s /= s.sum(axis=-1, keepdims=True)
                o = s.reshape(hkv, g * m, keys) @ vt[:, :keys]                  # [Hkv, g * m, D]
                out[q0 + c0:q0 + c0 + m] = o.reshape(hkv, g, m, d).transpose(2, 0, 1, 3).reshape(m, hq, d)
        return out if feeds is None else out.reshape(n_tok, hq * d)

    def mla_attention(self, q, c_kv, k_pe, positions, inv_freq, interleaved: bool, w_kv_b, cache,
                      meta: AttentionMetadata, scale: float) -> np.ndarray:
        """Multi-head latent attention (DeepSeek-V2/V3) in the absorbed form, over paged K pages of
        one KV head whose row for a token is its latent [rope(k_pe), c_kv] (the same rows serve as
        values; the layer has no V pages). q [N, H, dn + r]: per head the part without
        position, then the rotary part (r = 2 * len(inv_freq)); c_kv [N, R]: the normalised latent;
        k_pe [N, r]; w_kv_b [H * (dn + dv), R]: per head W_UK (dn rows), then W_UV (dv rows). W_UK
        goes into the query (q_nope W_UK scores against c_kv as q_nope against the keys W_UK c_kv)
        and W_UV onto the output (the weighted sum of c_kv), so no per-head key or value is ever
        made. Returns [N, H * dv]."""
        n, h, _ = q.shape
        r, rank = k_pe.shape[1], c_kv.shape[1]
        dn = q.shape[2] - r
        w = np.asarray(w_kv_b).reshape(h, -1, rank)
        q_latent = np.concatenate([q[..., dn:], np.einsum("nhd,hdc->nhc", q[..., :dn], w[:, :dn])], axis=2)
        q_latent = self.rope(q_latent, positions, inv_freq, interleaved)
        latent = self.rope(np.concatenate([k_pe, c_kv], axis=1)[:, None], positions, inv_freq, interleaved)
        _store_rows(cache, latent, meta.slot_mapping)
        out = self.paged_attention(q_latent, cache, cache, meta, scale)[..., r:]     # [N, H, R]
        return np.einsum("nhc,hvc->nhv", out, w[:, dn:]).reshape(n, -1)

    # --- mixture of experts --------------------------------------------------------------
    def moe_route(self, logits, bias, n_group: int, topk_group: int, top_k: int, norm: bool, scaling: float):
        """DeepSeek-V3's router (noaux_tc) over logits [N, E]: sigmoid scores; the top_k experts by
        score + bias among the topk_group groups (of n_group) whose two best score + bias sum
        highest; their weights the unbiased scores, normalised to sum 1 where norm, times
        scaling. -> (weights [N, top_k] float32, expert ids [N, top_k])."""
        scores = 1.0 / (1.0 + np.exp(-logits))
        choice = scores + bias
        n, e = choice.shape
        groups = np.sort(choice.reshape(n, n_group, e // n_group), axis=-1)[..., -2:].sum(axis=-1)
        best = np.argpartition(-groups, topk_group - 1, axis=1)[:, :topk_group]
        allowed = np.zeros((n, n_group), bool)
        np.put_along_axis(allowed, best, True, axis=1)
        choice = np.where(np.repeat(allowed, e // n_group, axis=1), choice, -np.inf)
        ids = np.argpartition(-choice, top_k - 1, axis=1)[:, :top_k]
        weights = np.take_along_axis(scores, ids, axis=1)
        if norm:
            weights = weights / (weights.sum(axis=1, keepdims=True) + 1e-20)
        return (weights * scaling).astype(np.float32), ids

    def moe_route_softmax(self, logits, top_k: int, norm: bool, n_group: int = 1, topk_group: int = 1):
        """Qwen3-Next's (and DeepSeek-V2's) router over logits [N, E]: softmax probabilities, the top_k
        largest (the lower expert id first among equals), renormalised to sum 1 where norm; with
        n_group > 1 only among the topk_group groups (of n_group) of the highest best probability
        (DeepSeek-V2's group_limited_greedy). -> (weights [N, top_k] float32, expert ids [N, top_k])."""
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        choice = p
        if n_group > 1:
            n, e = p.shape
            best = np.argsort(-p.reshape(n, n_group, e // n_group).max(axis=2), axis=1, kind="stable")[:, :topk_group]
            allowed = np.zeros((n, n_group), bool)
            np.put_along_axis(allowed, best, True, axis=1)
            choice = np.where(np.repeat(allowed, e // n_group, axis=1), p, -1.0)
        ids = np.argsort(-choice, axis=1, kind="stable")[:, :top_k]
        weights = np.take_along_axis(p, ids, axis=1)
        if norm:
            weights = weights / weights.sum(axis=1, keepdims=True)
        return weights.astype(np.float32), ids

    def moe_experts(self, x, ids, weights, w_gate, w_up, w_down) -> np.ndarray:
        """sum_j weights[:, j] * expert ids[:, j] of x [N, hidden]; expert e a gated MLP of w_gate[e],
        w_up[e] and w_down[e]. The rows routed to one expert go through it in one batch."""
        n, k = ids.shape
        flat = ids.reshape(-1)
        order = np.argsort(flat, kind="stable")
        bounds = np.searchsorted(flat[order], np.arange(len(w_gate) + 1))
        out = np.empty((n * k, x.shape[1]), np.float32)
        for e in np.flatnonzero(np.diff(bounds)):
            rows = order[bounds[e]:bounds[e + 1]]
            gate, up = self.linears(x[rows // k], [w_gate[e], w_up[e]])
            out[rows] = self.silu_mul_linear(gate, up, w_down[e])
        out *= weights.reshape(-1, 1)
        return out.reshape(n, k, -1).sum(axis=1)

    # --- Gated DeltaNet (linear attention with a recurrent state per sequence) -------------
    def causal_conv1d_silu(self, x, w, conv_states, slots, query_start) -> np.ndarray:
        """SiLU of the depthwise causal convolution over each sequence of the flat batch x [N, C]
        (sequence b: rows query_start[b]:query_start[b + 1]) with w [C, K]. conv_states [S, C,
        K - 1] holds, at row slots[b], sequence b's inputs at the K - 1 positions before this step's
        (zeros before position 0); they are replaced by its K - 1 latest inputs."""
        k = w.shape[1]
        out = np.empty_like(x)
        for b, slot in enumerate(slots.tolist()):
            q0, q1 = int(query_start[b]), int(query_start[b + 1])
            seq = np.concatenate([conv_states[slot].T, x[q0:q1]])           # [K - 1 + n, C]
            out[q0:q1] = sum(seq[j:j + q1 - q0] * w[:, j] for j in range(k))
            conv_states[slot] = seq[len(seq) - (k - 1):].T
        return out / (1.0 + np.exp(-out))

    def gated_delta_rule(self, q, k, v, b, a, a_log, dt_bias, states, slots, query_start) -> np.ndarray:
        """The gated delta rule of Gated DeltaNet over each sequence of the flat batch: q, k [N, Hk,
        Dk] (L2-normalised here, q also scaled by Dk^-1/2; value head h reads key head h // (Hv /
        Hk)), v [N, Hv, Dv], b and a [N, Hv] (beta = sigmoid(b), decay = exp(-exp(a_log) *
        softplus(a + dt_bias))). states [S, Hv, Dk, Dv]: sequence b's state S at row slots[b],
        updated per token as S = decay S; S += k (beta (v - k S))^T; the output is q S. Returns
        [N, Hv, Dv]. A sequence of CHUNKED_FROM tokens or more in the step (a prefill) takes the
        chunked form (_chunked_delta_rule), equal to float32 rounding; fewer go token by token."""
        rep = v.shape[1] // k.shape[1]
        q = np.repeat(_l2norm(q) / np.float32(np.sqrt(q.shape[2])), rep, axis=1)
        k = np.repeat(_l2norm(k), rep, axis=1)
        beta = 1.0 / (1.0 + np.exp(-b))
        x = a + dt_bias
        log_decay = -np.exp(a_log) * np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))  # torch's softplus
        decay = np.exp(log_decay)
        out = np.empty_like(v)
        for i, slot in enumerate(slots.tolist()):
            t0, t1 = int(query_start[i]), int(query_start[i + 1])
            if t1 - t0 >= CHUNKED_FROM:
                out[t0:t1] = _chunked_delta_rule(q[t0:t1], k[t0:t1], v[t0:t1], beta[t0:t1], log_decay[t0:t1],
                                                 states[slot])
                continue
            s = states[slot]
            for t in range(t0, t1):
                s *= decay[t][:, None, None]
                delta = (v[t] - np.einsum("hkv,hk->hv", s, k[t])) * beta[t][:, None]
                s += k[t][:, :, None] * delta[:, None, :]
                out[t] = np.einsum("hkv,hk->hv", s, q[t])
        return out


CHUNK = 64          # the chunked delta rule's chunk length (the FLA library's)
CHUNKED_FROM = 8    # from this many tokens of a sequence in a step the chunked form is the faster (at
                    # Qwen3-Next-80B's 32 value heads of 128 on one core; at 4 heads of 16, from about 32)


def _chunked_delta_rule(q, k, v, beta, log_decay, state) -> np.ndarray:
    """The gated delta rule over one sequence's n tokens, CHUNK at a time (all n where fewer; the
    FLA library's chunked form, as transformers' torch_chunk_gated_delta_rule): q, k [n, H, Dk]
    (normalised, q scaled), v [n, H, Dv], beta and log_decay [n, H]; state [H, Dk, Dv], updated in
    place. Returns the outputs [n, H, Dv].

    In a chunk, with G_i the sum of the log decays of its tokens up to i and S0 the state before
    it, the per-token updates u_i = beta_i (v_i - k_i S_i'), S_i' = e^G_i S0 + sum_{j<i} e^(G_i -
    G_j) k_j u_j^T the state decayed before token i, solve (I + A) U = beta V - beta e^G K S0 with
    A_ij = beta_i e^(G_i - G_j) k_i.k_j below the diagonal (the WY / UT form). So U = W - Kc S0,
    where W and Kc, solved for beta V and beta e^G K, do not depend on S0: one batched triangular
    inverse gives every chunk's, and only U, the outputs q_i S_i = e^G_i q_i S0 + sum_{j<=i} e^(G_i - G_j) q_i.k_j
    u_j and the state after the chunk, e^G_last S0 + sum_j e^(G_last - G_j) k_j u_j^T, go chunk by
    chunk."""
    n, h, _ = k.shape
    size = min(n, CHUNK)
    m = -(-n // size)

    def chunks(x):
        """[n, H, ...] -> [H, m, size, ...], zero-padded: a padded token (beta 0, decay 1) changes nothing."""
        x = np.moveaxis(x, 0, 1)
        x = np.pad(x, [(0, 0), (0, m * size - n)] + [(0, 0)] * (x.ndim - 2))
        return x.reshape(h, m, size, *x.shape[2:])

    q, k, v, beta = (chunks(x) for x in (q, k, v, beta))
    g = np.cumsum(chunks(log_decay.astype(np.float64)), axis=-1)      # G, in float64 for its differences
    diff = (g[..., :, None] - g[..., None, :]).astype(np.float32)
    gate = np.exp(np.where(np.tri(size, dtype=bool), diff, -np.inf))  # e^(G_i - G_j) for j <= i, else 0
    from_start = np.exp(g).astype(np.float32)[..., None]             # e^G_i
    to_end = np.exp(g[..., -1:] - g).astype(np.float32)[..., None]   # e^(G_last - G_j)
    k_beta = k * beta[..., None]
    inverse = _unit_lower_inverse(np.tril((k_beta @ k.swapaxes(-1, -2)) * gate, -1))   # (I + A)^-1
    w, kc = inverse @ (v * beta[..., None]), inverse @ (k_beta * from_start)
    qk = (q @ k.swapaxes(-1, -2)) * gate
    q_from_start, k_to_end = q * from_start, k * to_end
    out = np.empty_like(v)
    s = state
    for c in range(m):
        u = w[:, c] - kc[:, c] @ s
        out[:, c] = q_from_start[:, c] @ s + qk[:, c] @ u
        s = s * from_start[:, c, -1:] + k_to_end[:, c].swapaxes(-1, -2) @ u
    state[...] = s
    return np.moveaxis(out.reshape(h, m * size, -1)[:, :n], 0, 1)


def _unit_lower_inverse(a: np.ndarray) -> np.ndarray:
    """(I + a)^-1 of each strictly lower-triangular a [..., C, C], by forward substitution (row i
    of the inverse from rows < i: C - 1 steps over all the matrices at once)."""
    inv = np.broadcast_to(np.eye(a.shape[-1], dtype=a.dtype), a.shape).copy()
    for i in range(1, a.shape[-1]):
        inv[..., i, :i] -= (a[..., i:i + 1, :i] @ inv[..., :i, :i])[..., 0, :]
    return inv


def _l2norm(x: np.ndarray) -> np.ndarray:
    """x / sqrt(|x|^2 + 1e-6) over the last axis (the FLA library's, as transformers computes it)."""
    return x / np.sqrt((x * x).sum(axis=-1, keepdims=True) + 1e-6)


def _store_rows(cache, x, slots) -> None:
    """x [len(slots), kv_heads, head_dim] into a layer's K or V pages at the given slots."""
    if isinstance(cache, QuantKVCache):
        cache.store(slots, x)
    else:
        cache.reshape(-1, *cache.shape[2:])[slots] = x


def _cache_rows(cache, slots) -> np.ndarray:
    """The K or V rows [len(slots), kv_heads, head_dim] of a layer's pages at the given slots."""
    if isinstance(cache, QuantKVCache):
        return cache.rows(slots)
    return cache.reshape(-1, *cache.shape[2:])[slots]
