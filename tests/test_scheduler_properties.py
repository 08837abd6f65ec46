"""Property tests: the Scheduler driven by a fake runner over random workloads and tiny pools.

The fake runner keeps a model of the paged KV cache without arrays: each slot holds the
identity of the token written there (the whole token prefix up to and including it). Every
step it writes the scheduled tokens, then checks that every scheduled request reads, through
its block table, exactly its own prefix at every position: prefix hits, eviction, sharing
and preemption can only pass this if no block is ever reused while still meaningful. With
speculative decoding on, random draft tokens ride along and the rejected ones' slots hold
guesses: no cached block, and no read of a later step, may see them.
"""
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pocketcupy.sched import Request, RequestStatus, Scheduler

MAX_STEPS = 3000


@st.composite
def workloads(draw):
    bs = draw(st.integers(1, 4))
    num_blocks = draw(st.integers(2 if bs > 1 else 3, 10))
    cap = (num_blocks - 1) * bs            # tokens one request may hold (>= 2)
    vocab = draw(st.integers(1, 3))       # tiny vocabularies make shared prefixes common
    base = draw(st.lists(st.integers(0, vocab - 1), min_size=cap, max_size=cap))
    reqs = []
    for i in range(draw(st.integers(2, 8))):
        n_prompt = draw(st.integers(1, cap - 1))
        shared = draw(st.integers(0, n_prompt))
        prompt = base[:shared] + draw(st.lists(st.integers(0, vocab - 1), min_size=n_prompt - shared,
                                               max_size=n_prompt - shared))
        max_tokens = draw(st.integers(1, cap - n_prompt))
        reqs.append(dict(
            rid=f"r{i}", prompt=prompt, max_tokens=max_tokens,
            stop_after=draw(st.one_of(st.just(max_tokens), st.integers(1, max_tokens))),
            arrival=draw(st.integers(0, 6)), priority=draw(st.integers(0, 2)),
            abort_at=draw(st.integers(0, 30)) if draw(st.integers(0, 3)) == 0 else None,
            prompt_logits=draw(st.booleans()) and draw(st.booleans())))
    return dict(
        block_size=bs, num_blocks=num_blocks, reqs=reqs,
        max_num_seqs=draw(st.integers(1, 5)), budget=draw(st.integers(1, 12)),
        policy=draw(st.sampled_from(["fcfs", "priority"])), caching=draw(st.integers(0, 3)) > 0,
        vocab=vocab, seed=draw(st.integers(0, 2**16)), spec_k=draw(st.integers(0, 3)))


def check_blocks(s: Scheduler):
    kv, pool = s.kv_cache_manager, s.pool
    owners = {}
    for rid, blocks in kv.req_to_blocks.items():
        ids = [b.block_id for b in blocks]
        assert len(set(ids)) == len(ids), f"{rid} holds a block twice"
        assert 0 not in ids, "the null block was handed out"
        assert s.requests[rid].block_ids == ids
        for i in ids:
            owners[i] = owners.get(i, 0) + 1
    free = pool.free_block_ids()
    assert len(set(free)) == len(free) and 0 not in free
    for b in pool.blocks[1:]:
        assert b.ref_cnt == owners.get(b.block_id, 0), f"block {b.block_id}: ref_cnt {b.ref_cnt}"
        assert (b.ref_cnt == 0) == (b.block_id in free), f"block {b.block_id} leaked or double-owned"
        if b.ref_cnt > 1:
            assert b.block_hash is not None, "a shared block must be an immutable cached block"
    for h, bucket in pool.cached_block_hash_to_block.items():
        for bid, b in bucket.items():
            assert b.block_id == bid and b.block_hash == h
    for r in s.running:
        assert r.status == RequestStatus.RUNNING
        assert len(r.block_ids) * s.block_size >= r.num_computed_tokens
    for r in s.waiting:
        assert r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        assert r.block_ids == [] and r.num_computed_tokens == 0
    assert set(s.requests) == {r.request_id for r in s.running} | {r.request_id for r in s.waiting}


def run_workload(w):
    bs = w["block_size"]
    s = Scheduler(w["num_blocks"], bs, w["max_num_seqs"], w["budget"],
                  enable_prefix_caching=w["caching"], policy=w["policy"])
    rng = random.Random(w["seed"])
    specs = {r["rid"]: r for r in w["reqs"]}
    pending = sorted(w["reqs"], key=lambda r: r["arrival"])
    reqs: dict[str, Request] = {}
    kv_model: dict[int, tuple] = {}
    first_admission: list[str] = []
    ended: dict[str, RequestStatus] = {}

    def key(r):
        return s._key(r)

    for step in range(MAX_STEPS):
        while pending and pending[0]["arrival"] <= step:
            spec = pending.pop(0)
            r = Request(spec["rid"], list(spec["prompt"]), spec["max_tokens"], priority=spec["priority"],
                        arrival_time=float(spec["arrival"]), want_prompt_logits=spec["prompt_logits"])
            s.add(r)
            reqs[r.request_id] = r
        for rid, spec in specs.items():
            if spec["abort_at"] == step and rid in s.requests:
                s.abort(rid)
                ended[rid] = RequestStatus.FINISHED_ABORTED
        if not pending and not s.has_unfinished():
            break

        waiting_before = list(s.waiting)
        unfinished = [r for r in reqs.values() if r.request_id in s.requests]
        oldest = min(unfinished, key=key) if unfinished else None
        out = s.schedule()

        # budgets
        assert out.num_tokens <= w["budget"]
        assert len(out.scheduled) <= w["max_num_seqs"] and len(s.running) <= w["max_num_seqs"]
        assert len({i.request_id for i in out.scheduled}) == len(out.scheduled)
        # the best-keyed unfinished request (FCFS: the oldest) is never preempted
        assert oldest is None or oldest.request_id not in out.preempted_ids
        # admissions take a prefix of the waiting queue in key order
        admitted = [r for r in waiting_before if r.status == RequestStatus.RUNNING]
        still = [r for r in waiting_before if r in s.waiting and r.request_id not in out.preempted_ids]
        if admitted and still:
            assert max(map(key, admitted)) < min(map(key, still))
        for r in admitted:
            if r.request_id not in first_admission:
                first_admission.append(r.request_id)
        check_blocks(s)

        # the fake runner: write every new token's identity, then read every context
        seqs = {}   # request id -> its known tokens and this step's draft tokens
        for item in out.scheduled:
            r = s.requests[item.request_id]
            n, real = len(item.token_ids), len(item.token_ids) - item.num_draft
            assert real >= 1 and item.start_position == r.num_computed_tokens
            assert item.start_position + real <= r.num_tokens
            assert item.token_ids[:real] == r.all_token_ids[item.start_position:item.start_position + real]
            assert item.sample == (item.start_position + real == r.num_tokens)
            assert item.sample or not item.num_draft
            assert len(item.block_ids) * bs >= item.start_position + n
            seqs[item.request_id] = seq = r.all_token_ids + item.token_ids[real:]
            for p in range(item.start_position, item.start_position + n):
                kv_model[item.block_ids[p // bs] * bs + p % bs] = tuple(seq[:p + 1])
        # every block in the prefix cache holds what its hash says (once this step's writes land)
        for bucket in s.pool.cached_block_hash_to_block.values():
            for b in bucket.values():
                ident = [kv_model.get(b.block_id * bs + j) for j in range(bs)]
                assert all(ident) and tuple(x[-1] for x in ident) == b.token_ids, \
                    f"cached block {b.block_id} was never (fully) computed"
        for item in out.scheduled:
            toks = seqs[item.request_id]
            for p in range(item.start_position + len(item.token_ids)):
                slot = item.block_ids[p // bs] * bs + p % bs
                assert kv_model.get(slot) == tuple(toks[:p + 1]), f"{item.request_id} reads a stale slot at {p}"
        s.on_step_done(out)
        for item in out.scheduled:
            if item.sample:   # the engine's verification: tokens drawn while each equals its draft
                r = s.requests[item.request_id]
                drafts = item.token_ids[len(item.token_ids) - item.num_draft:]
                spec = specs[r.request_id]
                for depth in range(len(drafts) + 1):
                    tok = rng.randrange(w["vocab"])
                    s.append_token(r.request_id, tok)
                    done = len(r.output_token_ids) >= min(spec["stop_after"], r.max_tokens)
                    if done:
                        status = (RequestStatus.FINISHED_LENGTH if len(r.output_token_ids) >= r.max_tokens
                                  else RequestStatus.FINISHED_STOPPED)
                        s.finish(r.request_id, status)
                        ended[r.request_id] = status
                    kept = depth < len(drafts) and tok == drafts[depth]
                    if done or not kept:
                        if drafts:
                            s.drafts_verified(r.request_id, len(drafts), depth + kept)
                        break
                if w["spec_k"] and not done:   # the proposer: random guesses, often right in a tiny vocabulary
                    room = min(w["spec_k"], r.max_tokens - r.num_output_tokens - 1)
                    r.draft_token_ids = [rng.randrange(w["vocab"]) for _ in range(rng.randint(0, room))]
        check_blocks(s)
    else:
        raise AssertionError(f"not done after {MAX_STEPS} steps")

    # everything ended and every block is free again
    assert set(ended) == set(specs)
    for rid, r in reqs.items():
        assert r.status.finished and r.status == ended[rid]
        if r.status != RequestStatus.FINISHED_ABORTED:
            assert len(r.output_token_ids) == min(specs[rid]["stop_after"], r.max_tokens)
    assert s.pool.num_free == s.pool.num_usable_blocks and s.num_blocks_used == 0
    assert not s.kv_cache_manager.req_to_blocks and not s.running and not s.waiting
    if w["policy"] == "fcfs":   # first admissions happen in arrival order
        order = sorted(first_admission, key=lambda rid: key(reqs[rid]))
        assert first_admission == order
    return s


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_random_workloads(w):
    run_workload(w)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads().map(lambda w: {**w, "reqs": [{**r, "abort_at": None} for r in w["reqs"]]}))
def test_without_aborts_every_request_completes(w):
    s = run_workload(w)
    kv = s.kv_cache_manager
    assert s.num_computed_tokens_total >= sum(len(r["prompt"]) for r in w["reqs"]) - \
        kv.prefix_cache_hits - kv.prefix_cache_preempted_hits


def test_heavy_contention_forces_preemption():
    """A deterministic tiny-pool workload that must preempt, in both policies."""
    for policy in ("fcfs", "priority"):
        reqs = [dict(rid=f"r{i}", prompt=[i % 2] * 5, max_tokens=6, stop_after=6, arrival=0,
                     priority=i % 3, abort_at=None, prompt_logits=False) for i in range(6)]
        w = dict(block_size=2, num_blocks=7, reqs=reqs, max_num_seqs=4, budget=8, policy=policy,
                 caching=True, vocab=2, seed=1, spec_k=0)
        s = run_workload(w)
        assert s.num_preemptions > 0
