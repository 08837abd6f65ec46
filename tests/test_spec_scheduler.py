"""Speculative decoding in the scheduler and the n-gram proposer, without a model: draft tokens
ride behind a request's last known token, fit the budget and the pool or are dropped (never a
preemption), and the K/V of rejected ones is given back."""
import pytest

from pocketcupy import EngineArgs
from pocketcupy.sched import Request, RequestStatus, Scheduler
from pocketcupy.spec import NgramProposer


def decoding(s, rid="a", prompt=8, max_tokens=16):
    """A request whose prompt is computed and whose first output token is known."""
    r = Request(rid, list(range(100, 100 + prompt)), max_tokens)
    s.add(r)
    out = s.schedule()
    s.on_step_done(out)
    s.append_token(rid, 7)
    return r


def test_drafts_follow_the_last_token_and_are_consumed():
    s = Scheduler(16, 4, 8, 64)
    r = decoding(s)
    r.draft_token_ids = [1, 2, 3]
    out = s.schedule()
    (item,) = out.scheduled
    assert (item.token_ids, item.start_position, item.num_draft, item.sample) == ([7, 1, 2, 3], 8, 3, True)
    assert r.draft_token_ids == [] and r.block_ids == item.block_ids and len(r.block_ids) == 3  # 12 slots
    s.on_step_done(out)
    assert r.num_computed_tokens == 12
    s.append_token("a", 1)   # the first draft kept, then a token of the sampler's own
    s.append_token("a", 9)
    s.drafts_verified("a", 3, 1)
    assert r.num_computed_tokens == 10 and r.num_tokens == 11   # 7 and 1 computed; 9 is next
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (1, 3, 1)
    (nxt,) = s.schedule().scheduled
    assert (nxt.token_ids, nxt.start_position, nxt.num_draft) == ([9], 10, 0)


def test_drafts_cut_to_the_budget():
    s = Scheduler(16, 4, 8, 3)
    r = decoding(s, prompt=3)
    r.draft_token_ids = [1, 2, 3, 4]
    (item,) = s.schedule().scheduled
    assert item.token_ids == [7, 1, 2] and item.num_draft == 2


def test_no_drafts_during_a_chunked_prefill():
    s = Scheduler(16, 4, 8, 4)
    r = Request("a", list(range(10)), 4, draft_token_ids=[1, 2])
    s.add(r)
    (item,) = s.schedule().scheduled
    assert item.num_draft == 0 and item.token_ids == [0, 1, 2, 3] and not item.sample


def test_drafts_dropped_rather_than_preempting():
    # 5 usable blocks of 4: a holds 3 (its next token goes to slot 9), b 2; a's drafts would need a 4th
    s = Scheduler(6, 4, 8, 64)
    a = decoding(s, "a", prompt=8, max_tokens=4)
    s.add(Request("b", list(range(200, 207)), 2))
    s.on_step_done(s.schedule())
    s.append_token("a", 8)
    s.append_token("b", 5)
    assert s.kv_cache_manager.num_free_blocks == 0
    a.draft_token_ids = [1, 2, 3, 4]
    out = s.schedule()
    assert [(i.request_id, i.num_draft) for i in out.scheduled] == [("a", 0), ("b", 0)]
    assert out.preempted_ids == [] and s.num_preemptions == 0 and a.draft_token_ids == []


def test_blocks_of_draft_tokens_are_not_cached():
    s = Scheduler(16, 4, 8, 64)
    r = decoding(s, prompt=7)            # tokens 0..7 known, 7 computed
    r.draft_token_ids = [1, 2, 3, 4, 5]  # would fill block 1 (slots 4..7) and block 2 with guesses
    s.on_step_done(s.schedule())
    kv = s.kv_cache_manager
    assert kv.num_cached_block["a"] == 2 and len(r.block_hashes) == 2   # block 1 holds known tokens only
    s.append_token("a", 8)               # the first draft rejected
    s.drafts_verified("a", 5, 0)
    assert r.num_computed_tokens == 8 and kv.num_cached_block["a"] == 2


def test_preemption_clears_drafts_and_verification_after_finish_only_counts():
    s = Scheduler(16, 4, 8, 64)
    r = decoding(s)
    r.draft_token_ids = [1, 2]
    s._preempt(r, s.schedule())
    assert r.draft_token_ids == [] and r.status == RequestStatus.PREEMPTED
    s.finish("a", RequestStatus.FINISHED_STOPPED)
    s.drafts_verified("a", 2, 2)   # a stop among the kept tokens ended it
    assert s.num_accepted_tokens == 2 and s.get_stats()["spec_num_draft_tokens"] == 2


@pytest.mark.parametrize("tokens,limit,want", [
    ([1, 2, 3, 4, 1, 2], 10, [3, 4, 1, 2]),    # 2-gram [1, 2] recurs; its copy continues through itself
    ([9, 1, 2, 5, 1, 2, 6, 1, 2], 10, [6, 1, 2, 6]),   # the latest occurrence of the longest n-gram
    ([5, 6, 7, 5, 6, 8, 6, 7, 5, 6], 10, [8, 6, 7, 5]),  # 3-gram [7, 5, 6] beats the later 2-gram [5, 6]
    ([7, 8, 7, 8, 7, 8], 10, [7, 8, 7, 8]),    # period 2: still k tokens
    ([1, 2, 3, 4, 1, 2], 2, [3, 4]),           # the caller's limit (max_tokens left)
    ([1, 2, 3, 4, 5, 6], 10, []),              # nothing recurs
    ([1, 2, 3, 2], 10, []),                    # a 1-gram is below n_min 2
    ([3, 3], 10, []),                          # too short for any n-gram with a token after it
    ([1, 2, 3, 1, 2], 0, []),
])
def test_ngram_proposer(tokens, limit, want):
    assert NgramProposer(4, 2, 3).draft(tokens, limit) == want


def test_speculative_args_are_validated():
    with pytest.raises(ValueError, match="speculative_method: must be one of 'none', 'ngram'"):
        EngineArgs(speculative_method="eagle")
    with pytest.raises(ValueError, match="num_speculative_tokens: must be a positive integer"):
        EngineArgs(speculative_method="ngram", num_speculative_tokens=0)
    with pytest.raises(ValueError, match="prompt_lookup_min: 5 exceeds prompt_lookup_max 4"):
        EngineArgs(speculative_method="ngram", prompt_lookup_min=5)
    EngineArgs(speculative_method="ngram", async_scheduling="on")   # (on after steps at which none drafts)


def test_vllm_speculative_config_sets_the_fields():
    import argparse

    a = EngineArgs(speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5})
    assert (a.speculative_method, a.num_speculative_tokens, a.prompt_lookup_max) == ("ngram", 3, 5)
    assert a.speculative_config is None   # the fields alone hold it: dataclasses.replace keeps working
    a = EngineArgs(speculative_config='{"model": "draft.gguf", "num_speculative_tokens": 2}')
    assert (a.speculative_method, a.speculative_model) == ("draft_model", "draft.gguf")
    ap = argparse.ArgumentParser()
    EngineArgs.add_cli_args(ap)
    ns = ap.parse_args(["--speculative-config", '{"method": "ngram"}', "--max-num-seqs", "3"])
    assert EngineArgs.from_cli(ns).speculative_method == "ngram"
    assert EngineArgs.from_env({"POCKETCUPY_SPECULATIVE_CONFIG": '{"method": "ngram"}'}).speculative_method == "ngram"
    for bad, says in [('{"method": "ngram", "foo": 1}', "unknown key 'foo'"), ("{bad", "not valid JSON"),
                      ("[1]", "must be a dict"), ({"method": "eagle"}, "speculative_method: must be one of"),
                      ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens: must be a positive")]:
        with pytest.raises(ValueError, match=says):
            EngineArgs(speculative_config=bad)
    with pytest.raises(ValueError, match="speculative_config: sets speculative_method, which is also given"):
        EngineArgs(speculative_config={"method": "ngram"}, speculative_method="ngram")


def test_draft_model_catch_up_starts_from_what_it_holds():
    from pocketcupy.spec import DraftModelProposer

    p = DraftModelProposer(None, None, 4, 100, None, 64)
    r = Request("a", [1] * 10, 8, num_computed_tokens=9)
    assert p._start(r) == 0                  # never seen
    p._computed[r] = (0, 9)
    assert p._start(r) == 9
    r.num_computed_tokens = 7                # the target rejected drafts the draft model had fed
    assert p._start(r) == 7
    r.num_preemptions = 1                    # its blocks may come back filled by another request
    assert p._start(r) == 0
