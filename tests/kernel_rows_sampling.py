"""Kernel-table rows for the device sampler (cuda_src/sampling.cu): argmax, top-N logprobs with
ranks, the fused sample_rows kernel (greedy tokens with penalties/masks/min_tokens against the
NumPy Sampler; the top-k/top-p/min-p cut against sampler.apply_top_k/p/min_p) and Philox.

Integer outputs are compared exactly (tol 0). Logits for rank/order checks are well separated
(distinct multiples of a step much larger than a float32 ulp of the log-probs), so that
log-softmax rounding cannot merge two values and the NumPy ordering is unambiguous; ties get
their own rows with the device's rule (lower token id first)."""
from __future__ import annotations

import numpy as np

from pocketcupy.sampler import Sampler, SamplingRow, apply_min_p, apply_top_k, apply_top_p, log_softmax
from pocketcupy.sampling import SamplingParams

from .kernel_table import KernelRow

I32, F32 = np.int32, np.float32


def _cp():
    import cupy

    return cupy


def _sc():
    from pocketcupy.backend import sampler_cuda

    return sampler_cuda


def philox4x32_10(ctr, key: int) -> np.ndarray:
    """NumPy Philox 4x32-10 (Random123): uint32 counters [N, 4], 64-bit key -> uint32 [N, 4]."""
    c = np.asarray(ctr, np.uint64).copy()
    m32 = np.uint64(0xFFFFFFFF)
    k0, k1 = np.uint64(key & 0xFFFFFFFF), np.uint64(key >> 32)
    for r in range(10):
        if r:
            k0, k1 = (k0 + np.uint64(0x9E3779B9)) & m32, (k1 + np.uint64(0xBB67AE85)) & m32
        p0, p1 = np.uint64(0xD2511F53) * c[:, 0], np.uint64(0xCD9E8D57) * c[:, 2]
        c = np.stack([(p1 >> np.uint64(32)) ^ c[:, 1] ^ k0, p1 & m32, (p0 >> np.uint64(32)) ^ c[:, 3] ^ k1, p0 & m32], 1)
    return c.astype(np.uint32)


def separated(rng, B, V, span=24.0):
    """Distinct logits on a grid of step span/V (no two log-probs round together)."""
    return np.stack([rng.permutation(V) * (span / V) - span / 2 for _ in range(B)]).astype(F32)


def ref_topn(x: np.ndarray, tokens: np.ndarray, n: int):
    """Top-n ids by (logit desc, id asc), their logprobs, the token's logprob and rank."""
    lp = log_softmax(x)
    idx = np.arange(x.shape[1])
    ids = np.stack([np.lexsort((idx, -row))[:n] for row in x]).astype(I32)
    rows = np.arange(x.shape[0])
    tok_lp = lp[rows, tokens]
    rank = ((lp > tok_lp[:, None]).sum(1) + 1).astype(I32)
    return ids, np.take_along_axis(lp, ids, 1), tok_lp, rank


def cuda_topn(i, poison, n, sort_ids=False):
    sc, cp = _sc(), _cp()
    B = i["x"].shape[0]
    out = sc.topk_logprobs(cp.asarray(i["x"]), cp.asarray(i["tok"]), n, out=poison((B, sc.SO_WORDS), I32))
    ids = out[:, sc.SO_IDS:sc.SO_IDS + n]
    lps = out[:, sc.SO_LPS:sc.SO_LPS + n].view(cp.float32)
    if sort_ids:
        return cp.sort(ids, axis=1), lps
    return ids, lps, out[:, sc.SO_LP].view(cp.float32), out[:, sc.SO_RANK]


ROWS = []

# --- argmax ---------------------------------------------------------------------------------
for B, V, kind in [(5, 49152, "normal"), (3, 128256, "normal"), (4, 1000, "ties"), (2, 151936, "neginf"), (1, 7, "normal")]:
    def make(rng, B=B, V=V, kind=kind):
        x = rng.standard_normal((B, V)).astype(F32) * 3
        if kind == "ties":
            x = rng.integers(-3, 4, size=(B, V)).astype(F32)
        if kind == "neginf":
            x[rng.random((B, V)) < 0.7] = -np.inf
        return {"x": x}

    ROWS.append(KernelRow("argmax", f"{kind}-{B}x{V}", make, ref=lambda i: i["x"].argmax(1).astype(I32),
                          cuda=lambda i, poison: _sc().argmax(_cp().asarray(i["x"]), out=poison((i["x"].shape[0],), I32)),
                          tol=0.0))

# --- top-N logprobs + rank ------------------------------------------------------------------
for B, V, n in [(4, 49152, 20), (3, 128256, 5), (5, 1000, 1), (2, 151936, 0), (3, 50, 20)]:
    def make(rng, B=B, V=V):
        return {"x": separated(rng, B, V), "tok": rng.integers(0, V, size=B).astype(I32)}

    def ref(i, n=n):
        ids, lps, tok_lp, rank = ref_topn(i["x"], i["tok"], n)
        return ids, lps, tok_lp, rank

    ROWS.append(KernelRow("topk_logprobs", f"n{n}-{B}x{V}", make, ref=ref,
                          cuda=lambda i, poison, n=n: cuda_topn(i, poison, n), tol=1e-6))

for B, V, n, kind in [(3, 49152, 20, "int-ties"), (2, 1000, 7, "int-ties")]:
    def make(rng, B=B, V=V):  # ~V/9 ties per value: the N-th value's ties are taken lowest id first
        return {"x": rng.integers(-4, 5, size=(B, V)).astype(F32), "tok": rng.integers(0, V, size=B).astype(I32)}

    ROWS.append(KernelRow("topk_logprobs", f"{kind}-n{n}-{B}x{V}", make, ref=lambda i, n=n: ref_topn(i["x"], i["tok"], n),
                          cuda=lambda i, poison, n=n: cuda_topn(i, poison, n), tol=1e-6))

# Dense distinct values (1 + j * 2^-21): the first bucket holds every value, so the select needs
# a second digit pass (the int-ties rows above go through all three). Ids compared as sets (log-probs this close may round equal).
for B, V, n in [(2, 49152, 20), (2, 151936, 13)]:
    def make(rng, B=B, V=V):
        x = np.stack([1.0 + rng.permutation(V) * 2.0 ** -21 for _ in range(B)]).astype(F32)
        return {"x": x, "tok": rng.integers(0, V, size=B).astype(I32)}

    def ref(i, n=n):
        ids, lps, _, _ = ref_topn(i["x"], i["tok"], n)
        return np.sort(ids, 1), lps

    ROWS.append(KernelRow("topk_logprobs", f"dense-n{n}-{B}x{V}", make, ref=ref,
                          cuda=lambda i, poison, n=n: cuda_topn(i, poison, n, sort_ids=True), tol=1e-6))


# --- sample_rows ----------------------------------------------------------------------------
def run_sample_rows(x: np.ndarray, rows, poison, eos=()):
    sc, cp = _sc(), _cp()
    B, V = x.shape
    batch = sc.PackedBatch(rows, V, eos)
    params, toks, masks = batch.upload()
    work = cp.empty((B, V), cp.float32)
    cnt = cp.full((max(batch.n_cnt, 1), V), 12345, cp.int32)  # the kernel zeroes what it counts
    return sc.sample_rows(cp.asarray(x), params, toks, masks, batch.mask_words, work, cnt,
                          out=poison((B, sc.SO_WORDS), I32))


def greedy_rows(rng, B, V):
    rows = []
    for b in range(B):
        kw = {}
        kind = b % 6
        if kind == 1:
            kw["repetition_penalty"] = 1.3
        elif kind == 2:
            kw.update(frequency_penalty=0.7, presence_penalty=0.4)
        elif kind == 3:
            kw.update(repetition_penalty=0.8, frequency_penalty=-0.5, presence_penalty=1.5)
        elif kind == 4:
            kw.update(min_tokens=5, stop_token_ids=[int(t) for t in rng.integers(0, V, 3)])
        params = SamplingParams(temperature=0.0, **kw)
        mask = rng.random(V) < 0.5 if kind == 5 else None
        out = rng.integers(0, V, size=int(rng.integers(1, 60))).tolist()
        out = out[:2] if kind == 4 else out + out[:10]  # short: min_tokens active; else repeated ids
        rows.append(SamplingRow(params, prompt_ids=rng.integers(0, V, 300).tolist(), output_ids=out, allowed_mask=mask))
    return rows


for B, V in [(12, 49152), (6, 128256), (6, 1000)]:
    def make(rng, B=B, V=V):
        x = (rng.standard_normal((B, V)) * 2).astype(F32)
        rows, eos = greedy_rows(rng, B, V), int(rng.integers(0, V))
        for b, r in enumerate(rows):  # put the penalised / suppressed ids on top so that they matter
            x[b, r.output_ids[:3]] += 8.0
            x[b, r.params.stop_token_ids] += 9.0
            if r.params.min_tokens:
                x[b, eos] += 10.0
        return {"x": x, "rows": rows, "eos": [eos]}

    ROWS.append(KernelRow(
        "sample_rows", f"greedy-penalties-mask-{B}x{V}", make,
        ref=lambda i: Sampler(i["eos"])(i["x"], i["rows"]).token_ids.astype(I32),
        cuda=lambda i, poison: run_sample_rows(i["x"], i["rows"], poison, i["eos"])[:, 0], tol=0.0))


def run_sample_rows_at(x: np.ndarray, rows, poison):
    """sample_rows_at into a poisoned buffer named through out_at, as a decode graph runs it."""
    sc, cp = _sc(), _cp()
    B, V = x.shape
    out = poison((B, sc.SO_WORDS), I32)
    params = cp.asarray(sc.CudaSampler().graph_params(rows, V))
    sc.sample_rows_at(cp.asarray(x), params, cp.empty((B + 1, V + 5), cp.float32),
                      cp.asarray(np.array([out.data.ptr], np.int64)))
    return out


FILTERS = [  # temperature, top_k, top_p, min_p
    (1.0, 50, 1.0, 0.0), (0.7, 0, 0.9, 0.0), (1.3, 0, 1.0, 0.05), (1.0, 1000, 0.95, 0.01),
    (0.5, 3000, 0.5, 0.0), (2.0, 0, 0.99, 0.0), (1.0, 1, 1.0, 0.0), (1.0, 5000, 1.0, 0.0),
]


def ref_cut(x: np.ndarray, rows):
    """Tokens left by temperature -> min-p -> top-k -> top-p (NumPy sampler): count and min value."""
    kept, lo = [], []
    for b, r in enumerate(rows):
        p = r.params
        y = x[b:b + 1] / np.array([p.temperature], F32)[:, None]
        y = apply_min_p(y, np.array([p.min_p], np.float64))
        y = apply_top_k(y, np.array([p.top_k]))
        y = apply_top_p(y, np.array([p.top_p], np.float64))
        fin = np.isfinite(y[0])
        kept.append(fin.sum())
        lo.append(y[0][fin].min())
    return np.array(kept, I32), np.array(lo, F32)


for V, span in [(49152, 24.0), (151936, 12.0), (1000, 30.0)]:
    def make(rng, V=V, span=span):
        x = separated(rng, len(FILTERS), V, span)
        rows = [SamplingRow(SamplingParams(temperature=t, top_k=k, top_p=tp, min_p=mp, seed=j))
                for j, (t, k, tp, mp) in enumerate(FILTERS)]
        return {"x": x, "rows": rows}

    for op, run in [("sample_rows", run_sample_rows), ("sample_rows_at", run_sample_rows_at)]:
        def cuda(i, poison, run=run):
            sc = _sc()
            out = run(i["x"], i["rows"], poison)
            return out[:, sc.SO_KEPT], out[:, sc.SO_MINKEPT].view(_cp().float32)

        ROWS.append(KernelRow(op, f"cut-topk-topp-minp-{V}", make,
                              ref=lambda i: ref_cut(i["x"], i["rows"]), cuda=cuda, tol=0.0))

# --- sample_rows_at: the decode graph's sampler, parameters from CudaSampler.graph_params -------
for B, V in [(7, 49152), (3, 151936), (1, 1000)]:
    def make(rng, B=B, V=V):   # greedy rows, with and without logprobs
        rows = [SamplingRow(SamplingParams(temperature=0.0, logprobs=[None, 5, 0][b % 3])) for b in range(B)]
        return {"x": separated(rng, B, V), "rows": rows}

    def ref(i):
        out = Sampler()(i["x"], i["rows"])
        lp = np.array([0.0 if d is None else d[t].logprob for d, t in zip(out.logprobs, out.token_ids)], F32)
        return out.token_ids.astype(I32), lp

    def cuda(i, poison):
        sc = _sc()
        out = run_sample_rows_at(i["x"], i["rows"], poison)
        want_lp = _cp().asarray([r.params.logprobs is not None for r in i["rows"]])
        return out[:, sc.SO_TOK], _cp().where(want_lp, out[:, sc.SO_LP].view(_cp().float32), 0.0)

    ROWS.append(KernelRow("sample_rows_at", f"greedy-logprobs-{B}x{V}", make, ref=ref, cuda=cuda, tol=(0.0, 1e-6)))

# --- Philox ---------------------------------------------------------------------------------
for n, key in [(1000, 0x0123456789ABCDEF), (3, 0)]:
    def make(rng, n=n):
        return {"c": rng.integers(0, 2**32, size=(n, 4), dtype=np.uint64).astype(np.uint32)}

    ROWS.append(KernelRow("philox4x32", f"{n}-key{key:x}", make, ref=lambda i, key=key: philox4x32_10(i["c"], key),
                          cuda=lambda i, poison, key=key: _sc().philox4x32(_cp().asarray(i["c"]), key,
                                                                           out=poison(i["c"].shape, np.uint32)),
                          tol=0.0))

# --- the previous step's sampled ids into this step's input ids (async scheduling) --------------
def _make_fed_ids(size: int, pool: int, k: int, B: int):
    """ids [size]; k destination rows drawn from the first `pool`, each fed from one of B sampler
    result rows (ids in column 0)."""
    def make(rng):
        res = rng.integers(0, 49152, size=(B, 48)).astype(np.int32)
        return {"ids": rng.integers(0, 49152, size=size).astype(np.int64), "res": res,
                "dst": rng.permutation(pool)[:k].tolist(), "src": rng.integers(0, B, size=k).tolist()}
    return make


def _ref_fed_ids(i):
    ids = i["ids"].copy()
    ids[i["dst"]] = i["res"][i["src"], 0]
    return ids


def _cuda_scatter_tokens(i, poison):
    from pocketcupy.backend import elementwise_cuda

    ids = _cp().asarray(i["ids"])
    elementwise_cuda.scatter_tokens(ids, i["dst"], _cp().asarray(i["res"])[:, 0], i["src"])
    return ids


for n_ids, B, n in [(7, 5, 3), (300, 64, 64), (1, 1, 1)]:
    ROWS.append(KernelRow("scatter_tokens", f"{n}-of-{n_ids}-from-{B}", _make_fed_ids(n_ids, n_ids, n, B),
                          ref=_ref_fed_ids, cuda=_cuda_scatter_tokens, tol=0.0))

# --- the same inside a decode graph: rows < n of a buffer of `top`, the source named by the feed ----
for top, n, fed, B in [(8, 5, 3, 4), (256, 64, 64, 64), (1, 1, 1, 1), (4, 3, 0, 2)]:
    def cuda(i, poison, top=top, n=n):
        from pocketcupy.backend import elementwise_cuda as ew

        tokens = _cp().asarray(i["res"])[:, 0]
        feed = np.full(ew.feed_row_count(top), 7, np.int64)      # stale rows past n must not be read
        ew.fill_feed(feed, n, (i["dst"], tokens, i["src"]) if i["dst"] else None)
        ids = _cp().asarray(i["ids"])
        ew.feed_tokens(_cp().asarray(feed), n, ids)
        return ids

    ROWS.append(KernelRow("feed_tokens", f"{fed}-of-{n}-of-{top}", _make_fed_ids(top, n, fed, B),
                          ref=_ref_fed_ids, cuda=cuda, tol=0.0))
