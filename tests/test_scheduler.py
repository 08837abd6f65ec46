"""The step scheduler on its own: chunked prefill, budgets, preemption, policies, prefix sharing."""
import pytest

from pocketcupy.sched import Request, RequestStatus, Scheduler


def make(num_blocks=16, block_size=4, max_num_seqs=8, budget=64, **kw):
    return Scheduler(num_blocks, block_size, max_num_seqs, budget, **kw)


def add(s, rid, n_prompt, max_tokens=4, t=0.0, priority=0, tokens=None, **kw):
    """A request with its own prompt tokens (no prefix shared with others) unless `tokens`."""
    base = 1000 * (len(s.requests) + s.num_steps + 1)
    r = Request(rid, list(tokens) if tokens is not None else [base + i for i in range(n_prompt)], max_tokens,
                priority=priority, arrival_time=t, **kw)
    s.add(r)
    return r


def step(s, token=1):
    """One step with a fake runner: every request that reaches its end samples `token`;
    requests that reach max_tokens finish."""
    out = s.schedule()
    s.on_step_done(out)
    for item in out.scheduled:
        if item.sample:
            s.append_token(item.request_id, token)
            r = s.requests[item.request_id]
            if len(r.output_token_ids) >= r.max_tokens:
                s.finish(item.request_id, RequestStatus.FINISHED_LENGTH)
    return out


def plan(out):
    return [(i.request_id, i.start_position, len(i.token_ids), i.sample) for i in out.scheduled]


def test_chunked_prefill_then_decode():
    s = make(budget=8)
    add(s, "a", 20)
    assert plan(step(s)) == [("a", 0, 8, False)]
    assert plan(step(s)) == [("a", 8, 8, False)]
    out = step(s)
    assert plan(out) == [("a", 16, 4, True)]
    assert out.scheduled[0].block_ids == [1, 2, 3, 4, 5]
    assert plan(step(s)) == [("a", 20, 1, True)]


def test_running_first_then_waiting_within_budget():
    s = make(budget=10)
    add(s, "a", 6, t=0)
    add(s, "b", 6, t=1)
    assert plan(step(s)) == [("a", 0, 6, True), ("b", 0, 4, False)]
    assert plan(step(s)) == [("a", 6, 1, True), ("b", 4, 2, True)]
    add(s, "c", 30, t=2)
    assert plan(step(s)) == [("a", 7, 1, True), ("b", 6, 1, True), ("c", 0, 8, False)]


def test_max_num_seqs():
    s = make(max_num_seqs=2)
    for i in range(3):
        add(s, f"r{i}", 3, t=i)
    assert [i.request_id for i in step(s).scheduled] == ["r0", "r1"]
    assert len(s.running) == 2 and len(s.waiting) == 1
    s.finish("r0", RequestStatus.FINISHED_ABORTED)
    assert [i.request_id for i in step(s).scheduled] == ["r1", "r2"]


def test_request_that_never_fits_is_rejected():
    s = make(num_blocks=5, block_size=4)   # 4 usable blocks = 16 tokens
    add(s, "ok", 12, max_tokens=5)   # the last token needs no K/V: 16 slots
    with pytest.raises(ValueError, match="KV blocks"):
        add(s, "big", 12, max_tokens=6)
    with pytest.raises(ValueError, match="request_id"):
        add(s, "ok", 1)
    assert list(s.waiting) == [s.requests["ok"]]


def test_rejection_names_the_field_to_lower():
    """The server turns the message's head into the 400's `param`: max_tokens when the prompt
    alone fits, prompt when it does not."""
    s = make(num_blocks=5, block_size=4)   # 16 tokens
    with pytest.raises(ValueError, match="^max_tokens: 12 prompt tokens plus max_tokens 6 need 5 KV blocks"):
        add(s, "a", 12, max_tokens=6)
    with pytest.raises(ValueError, match="^prompt: 17 prompt tokens"):
        add(s, "b", 17, max_tokens=1)
    assert not s.requests


@pytest.mark.parametrize("kwargs, says", [
    (dict(num_computed_tokens=30), "num_computed_tokens: must be 0"),   # past the prompt: waited forever
    (dict(num_computed_tokens=9), "num_computed_tokens: must be 0"),    # 5 blocks asked of 4: waited forever
    (dict(num_computed_tokens=-3), "num_computed_tokens: must be 0"),   # its 9 tokens scheduled into 2 blocks
    (dict(output_token_ids=[5, 5, 5, 5]), "max_tokens: 4 leaves no token"),
    (dict(max_tokens=0), "max_tokens: 0 leaves no token"),
    (dict(prompt_token_ids=[]), "prompt: must not be empty")])
def test_add_refuses_a_request_it_could_never_run(kwargs, says):
    """A request added again (resumed) with a stale num_computed_tokens: admission counted those tokens
    as already in blocks, so 30 of them asked a 4-block pool for 10 blocks at every step and the request
    never ran, nor failed. Such a request, and one with nothing to sample, is a ValueError naming the field;
    a resumed request with output tokens left to sample runs (they are computed again)."""
    s = make(num_blocks=5, block_size=4)
    r = Request("r", kwargs.pop("prompt_token_ids", list(range(9))), kwargs.pop("max_tokens", 4), **kwargs)
    with pytest.raises(ValueError, match="^" + says):
        s.add(r)
    assert not s.requests and not s.waiting
    resumed = Request("ok", list(range(9)), 4, output_token_ids=[5, 5])
    s.add(resumed)
    while s.has_unfinished():
        step(s)
    assert resumed.num_output_tokens == 4 and s.num_blocks_used == 0


def test_fcfs_preempts_the_newest_and_resumes_it_first():
    s = make(num_blocks=5, block_size=4)   # 4 usable
    a = add(s, "a", 8, max_tokens=8, t=0)  # 2 blocks, grows to 4
    b = add(s, "b", 8, max_tokens=8, t=1)
    c = add(s, "c", 3, max_tokens=2, t=2)
    step(s)
    assert a.block_ids == [1, 2] and b.block_ids == [3, 4] and c.status == RequestStatus.WAITING
    out = step(s)   # a and b both cross into a third block: b (newest) gives up its blocks
    assert out.preempted_ids == ["b"] and plan(out) == [("a", 8, 1, True)]
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0 and b.block_ids == []
    assert [r.request_id for r in s.waiting] == ["b", "c"]  # b arrived before c
    assert s.num_preemptions == 1 and b.num_preemptions == 1
    while a.status == RequestStatus.RUNNING:
        step(s)
    # b is recomputed (prompt + its output so far) before c is admitted
    out = step(s)
    assert out.scheduled[0].request_id == "b"
    assert out.scheduled[0].token_ids == b.prompt_token_ids + [1]


def test_a_preempted_requests_second_lookup_is_counted_apart():
    """As vLLM's stats: a victim that finds its own blocks again on re-admission does not count
    as prefix-cache queries and hits (it would make the hit rate look better the more the pool
    thrashes); its lookups go to prefix_cache_preempted_queries / _hits."""
    s = make(num_blocks=5, block_size=4)   # 4 usable
    a = add(s, "a", 8, max_tokens=2, t=0)
    b = add(s, "b", 8, max_tokens=2, t=1)
    step(s)
    assert step(s).preempted_ids == ["b"]   # a takes b's tail block; b's first block stays cached
    assert a.status == RequestStatus.FINISHED_LENGTH
    out = step(s)
    assert plan(out) == [("b", 4, 5, True)] and b.num_cached_tokens == 0
    st = s.get_stats()
    assert (st["prefix_cache_queries"], st["prefix_cache_hits"]) == (16, 0)
    assert (st["prefix_cache_preempted_queries"], st["prefix_cache_preempted_hits"]) == (9, 4)


def test_a_preempted_request_resumes_from_its_cached_block_with_the_blocks_it_needs():
    """Re-admitted, a victim starts from what the prefix cache still holds of it (its own first block) and
    holds exactly the blocks of its tokens. The engine's test_preemption_keeps_tokens cannot see a wrong
    block count: a num_computed_tokens left stale by the preemption made allocate_slots count those tokens
    twice (a block too many, which a tight pool refuses), yet admission then sets it to the hit, so the
    tokens come out the same."""
    s = make(num_blocks=5, block_size=4)   # 4 usable
    add(s, "a", 8, max_tokens=2, t=0)
    b = add(s, "b", 8, max_tokens=3, t=1)
    step(s)
    cached = b.block_ids[0]
    assert step(s).preempted_ids == ["b"]   # a takes b's tail block; b's first block stays cached
    assert b.block_ids == [] and not s.kv_cache_manager.req_to_blocks.get("b")
    out = step(s)
    assert plan(out) == [("b", 4, 5, True)]   # 4 tokens from the hit, the rest of its 8 + 1 computed
    assert b.num_computed_tokens == 9 and b.block_ids[0] == cached and len(set(b.block_ids)) == 3
    assert s.num_blocks_used == 3
    while s.has_unfinished():
        step(s)
    assert len(b.output_token_ids) == 3 and s.num_blocks_used == 0


def test_preemption_frees_blocks_tail_first():
    s = make(num_blocks=5, block_size=4, enable_prefix_caching=False)
    add(s, "a", 8, max_tokens=5, t=0, tokens=range(8))
    add(s, "b", 8, max_tokens=5, t=1, tokens=range(10, 18))
    step(s)
    assert s.pool.free_block_ids() == []
    out = step(s)
    assert out.preempted_ids == ["b"]
    assert s.requests["a"].block_ids == [1, 2, 4]    # a took b's tail block (4) first
    assert s.pool.free_block_ids() == [3]


def test_preempting_a_request_scheduled_earlier_in_the_step():
    """running = [y, x] with y newer-keyed: x's growth preempts y after y was scheduled."""
    s = make(num_blocks=4, block_size=4, policy="priority")   # 3 usable
    y = add(s, "y", 3, max_tokens=5, t=0, priority=5)
    step(s)
    x = add(s, "x", 4, max_tokens=4, t=1, priority=0)
    step(s)
    assert [r.request_id for r in s.running] == ["y", "x"]
    assert y.block_ids == [1] and x.block_ids == [2]
    out = step(s)   # y is scheduled (block 3), then x needs a block: y (largest key) is dropped again
    assert out.preempted_ids == ["y"] and plan(out) == [("x", 4, 1, True)]
    assert x.block_ids == [2, 3] and s.pool.free_block_ids() == [1]
    assert y.num_computed_tokens == 0 and s.num_blocks_used == 2
    assert out.num_tokens == 1


def test_priority_orders_waiting_and_preempts_worst():
    s = make(num_blocks=9, block_size=4, max_num_seqs=2, policy="priority")
    add(s, "low", 4, priority=2, t=0)
    add(s, "mid", 4, priority=1, t=1)
    add(s, "high", 4, priority=0, t=2)
    add(s, "high2", 4, priority=0, t=3)
    assert [r.request_id for r in s.waiting] == ["high", "high2", "mid", "low"]
    assert [i.request_id for i in step(s).scheduled] == ["high", "high2"]
    s.finish("high2", RequestStatus.FINISHED_STOPPED)
    assert [i.request_id for i in step(s).scheduled] == ["high", "mid"]
    # a better request arriving later takes the place of the worst running one
    add(s, "urgent", 4, priority=-1, t=4)
    out = step(s)
    assert out.preempted_ids == ["mid"]
    assert [i.request_id for i in out.scheduled] == ["high", "urgent"]
    assert [r.request_id for r in s.waiting] == ["mid", "low"]


def test_fcfs_does_not_preempt_for_waiting_requests():
    s = make(num_blocks=9, max_num_seqs=1)
    add(s, "a", 4, t=0, priority=5)
    step(s)
    add(s, "b", 4, t=1, priority=-5)
    out = step(s)
    assert plan(out) == [("a", 4, 1, True)] and not out.preempted_ids


def test_abort_anywhere_frees_blocks():
    s = make(num_blocks=6, block_size=4, max_num_seqs=1)
    add(s, "a", 8, t=0)
    add(s, "b", 8, t=1)
    step(s)
    assert s.num_blocks_used == 2   # a: 8 prompt tokens computed (the sampled one gets block 3 next step)
    assert s.abort("b").status == RequestStatus.FINISHED_ABORTED    # waiting
    assert s.abort("a").status == RequestStatus.FINISHED_ABORTED    # running
    assert s.abort("a") is None
    assert not s.has_unfinished() and s.num_blocks_used == 0
    assert not s.running and not s.waiting


def test_siblings_share_prompt_blocks_in_the_same_step():
    s = make(num_blocks=16, block_size=4)
    prompt = list(range(10))
    rs = [add(s, f"r#{i}", 10, t=0, tokens=prompt) for i in range(3)]
    out = step(s)
    assert plan(out) == [("r#0", 0, 10, True), ("r#1", 8, 2, True), ("r#2", 8, 2, True)]
    assert [r.block_ids for r in rs] == [[1, 2, 3], [1, 2, 4], [1, 2, 5]]
    assert [r.num_cached_tokens for r in rs] == [0, 8, 8]
    assert s.num_blocks_used == 5
    st = s.get_stats()
    assert st["prefix_cache_queries"] == 30 and st["prefix_cache_hits"] == 16
    assert st["num_computed_tokens_total"] == 14


def test_prefix_reused_across_steps_and_after_finish():
    s = make(num_blocks=16, block_size=4, enable_prefix_caching=True)
    a = add(s, "a", 9, max_tokens=1, t=0, tokens=range(9))
    step(s)
    assert a.status == RequestStatus.FINISHED_LENGTH and s.num_blocks_used == 0
    b = add(s, "b", 12, max_tokens=1, t=1, tokens=list(range(8)) + [1, 2, 3, 4])
    out = step(s)
    assert plan(out) == [("b", 8, 4, True)] and b.num_cached_tokens == 8
    assert out.scheduled[0].block_ids[:2] == [1, 2]


def test_prefix_caching_off():
    s = make(enable_prefix_caching=False)
    rs = [add(s, f"r{i}", 9, t=0, tokens=range(9)) for i in range(2)]
    out = step(s)
    assert plan(out) == [("r0", 0, 9, True), ("r1", 0, 9, True)]
    assert [r.num_cached_tokens for r in rs] == [0, 0]


def test_num_cached_tokens_kept_after_preemption():
    s = make(num_blocks=7, block_size=2)   # 6 usable
    add(s, "warm", 5, max_tokens=1, t=0, tokens=[1, 2, 3, 4, 5])
    step(s)                                # leaves [1, 2] [3, 4] in the prefix cache
    b = add(s, "b", 5, max_tokens=6, t=1, tokens=[5, 5, 5, 5, 5])
    a = add(s, "a", 5, max_tokens=6, t=2, tokens=[1, 2, 3, 4, 9])
    step(s)
    assert a.num_cached_tokens == 4 and b.num_cached_tokens == 0
    while a.num_preemptions == 0:
        step(s)
    assert s.requests["a"] is a and a.status == RequestStatus.PREEMPTED
    while s.has_unfinished():
        step(s)
    assert a.num_cached_tokens == 4 and len(a.output_token_ids) == 6
    assert s.num_blocks_used == 0


def test_prompt_logits_request_computes_whole_prompt():
    s = make()
    add(s, "a", 9, max_tokens=1, t=0, tokens=range(9))
    step(s)
    b = add(s, "b", 9, max_tokens=1, t=1, tokens=range(9), want_prompt_logits=True)
    out = step(s)
    assert plan(out) == [("b", 0, 9, True)] and out.scheduled[0].prompt_logits
    assert b.num_cached_tokens == 0


def test_bad_policy():
    with pytest.raises(ValueError, match="scheduling_policy"):
        make(policy="lifo")


def test_engine_args_scheduling_fields():
    from pocketcupy import EngineArgs

    a = EngineArgs()
    assert a.enable_prefix_caching is True and a.scheduling_policy == "fcfs"
    with pytest.raises(ValueError, match="scheduling_policy"):
        EngineArgs(scheduling_policy="lifo")
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        EngineArgs(enable_prefix_caching="yes")
    env = EngineArgs.from_env({"POCKETCUPY_SCHEDULING_POLICY": "priority", "POCKETCUPY_ENABLE_PREFIX_CACHING": "0"})
    assert env.scheduling_policy == "priority" and env.enable_prefix_caching is False


def test_a_request_whose_last_token_is_pending_is_not_scheduled():
    """Async scheduling: the token that reaches max_tokens needs no K/V, so a request whose
    output is full (its last token still pending) computes nothing more."""
    from pocketcupy.sched.request import PENDING_TOKEN

    s = make()
    add(s, "a", 3, max_tokens=2)
    add(s, "b", 3, max_tokens=4)
    for _ in range(2):
        out = s.schedule()
        s.on_step_done(out)
        for item in out.scheduled:
            s.append_token(item.request_id, PENDING_TOKEN)
    assert plan(out) == [("a", 3, 1, True), ("b", 3, 1, True)]
    assert plan(s.schedule()) == [("b", 4, 1, True)]
