"""KVCacheManager: block tables, prefix hits through chained block hashes, eviction order."""
import pytest

from pocketcupy.sched import kv_cache_manager as kvm
from pocketcupy.sched.kv_cache_manager import KVCacheManager, hash_block_tokens
from pocketcupy.sched.request import Request

BS = 4


def req(rid, tokens, **kw):
    return Request(rid, list(tokens), max_tokens=kw.pop("max_tokens", 8), **kw)


def admit(kv, r):
    """What the scheduler does on admission: hits, allocation of the rest, cache the full blocks."""
    hits, n_hit = kv.get_computed_blocks(r)
    new = kv.allocate_slots(r, r.num_tokens - n_hit, hits)
    assert new is not None
    r.num_computed_tokens = n_hit
    kv.cache_blocks(r, r.num_tokens)
    r.num_computed_tokens = r.num_tokens
    return n_hit, [b.block_id for b in new]


def test_block_hashes_chain():
    kv = KVCacheManager(10, BS)
    r = req("a", range(10))
    assert kv.update_block_hashes(r) == [
        hash_block_tokens(None, (0, 1, 2, 3)),
        hash_block_tokens(hash_block_tokens(None, (0, 1, 2, 3)), (4, 5, 6, 7))]
    r.output_token_ids += [10, 11]  # the third block is full now
    assert len(kv.update_block_hashes(r)) == 3
    assert r.block_hashes[2] == hash_block_tokens(r.block_hashes[1], (8, 9, 10, 11))


def test_prefix_hit_and_free_order():
    kv = KVCacheManager(10, BS)
    a = req("a", range(10))
    assert admit(kv, a) == (0, [1, 2, 3])
    assert a.block_ids == [1, 2, 3]
    assert [kv.block_pool.blocks[i].block_hash is not None for i in (1, 2, 3)] == [True, True, False]
    b = req("b", list(range(8)) + [50, 51])
    assert admit(kv, b) == (8, [4])
    assert b.block_ids == [1, 2, 4]
    assert [kv.block_pool.blocks[i].ref_cnt for i in (1, 2, 3, 4)] == [2, 2, 1, 1]
    assert kv.block_pool.free_block_ids() == [5, 6, 7, 8, 9]
    kv.free(a)
    assert kv.block_pool.free_block_ids() == [5, 6, 7, 8, 9, 3]
    kv.free(b)
    assert kv.block_pool.free_block_ids() == [5, 6, 7, 8, 9, 3, 4, 2, 1]
    assert a.block_ids == [] and b.block_ids == [] and kv.num_used_blocks == 0
    # the cached prefix is still there for a third request
    c = req("c", list(range(8)) + [60])
    assert admit(kv, c) == (8, [5])
    assert c.block_ids == [1, 2, 5]
    assert kv.block_pool.free_block_ids() == [6, 7, 8, 9, 3, 4]


def test_hit_never_covers_the_last_token():
    kv = KVCacheManager(10, BS)
    admit(kv, req("a", range(8)))
    same = req("b", range(8))
    hits, n = kv.get_computed_blocks(same)
    assert [h.block_id for h in hits] == [1] and n == 4  # block 2 would leave nothing to compute
    longer = req("c", range(9))
    hits, n = kv.get_computed_blocks(longer)
    assert [h.block_id for h in hits] == [1, 2] and n == 8


def test_recompute_last_hit_block():
    """For MTP drafts: a hit's last block is computed again (a hit of one block is none)."""
    kv = KVCacheManager(10, BS, recompute_last_hit_block=True)
    admit(kv, req("a", range(10)))
    hits, n = kv.get_computed_blocks(req("b", list(range(8)) + [50]))
    assert [h.block_id for h in hits] == [1] and n == 4
    assert kv.get_computed_blocks(req("c", list(range(4)) + [50])) == ([], 0)


def test_eviction_drops_lru_tail_first():
    kv = KVCacheManager(7, BS)   # 6 usable blocks
    a = req("a", range(12))      # blocks 1, 2, 3: all full and cached
    admit(kv, a)
    kv.free(a)
    assert kv.block_pool.free_block_ids() == [4, 5, 6, 3, 2, 1]
    big = req("big", range(100, 116))  # needs 4 blocks: 4, 5, 6 and then evicts 3 (a's tail)
    assert admit(kv, big) == (0, [4, 5, 6, 3])
    assert kv.block_pool.free_block_ids() == [2, 1]
    # a's first two blocks are still cached; its third was evicted
    again = req("a2", range(13))
    hits, n = kv.get_computed_blocks(again)
    assert [h.block_id for h in hits] == [1, 2] and n == 8


def test_allocate_counts_free_hit_blocks_as_taken():
    kv = KVCacheManager(5, BS)   # 4 usable
    a = req("a", range(8))
    admit(kv, a)                 # blocks 1, 2 (cached)
    kv.free(a)                   # free queue: 3, 4, 2, 1
    filler = req("f", range(200, 208))
    admit(kv, filler)            # takes 3, 4
    assert kv.block_pool.free_block_ids() == [2, 1]
    b = req("b", list(range(8)) + [9, 9, 9])   # hits 1, 2 (both free), needs one more block
    hits, n = kv.get_computed_blocks(b)
    assert [h.block_id for h in hits] == [1, 2] and n == 8
    before = (kv.block_pool.free_block_ids(), [x.ref_cnt for x in kv.block_pool.blocks])
    assert kv.allocate_slots(b, 3, hits) is None   # the two free blocks are the hits themselves
    assert (kv.block_pool.free_block_ids(), [x.ref_cnt for x in kv.block_pool.blocks]) == before
    assert "b" not in kv.req_to_blocks and b.block_ids == []
    # with only the hits and one token to compute in their blocks' room it fits
    c = req("c", list(range(8)) + [5])
    hits, n = kv.get_computed_blocks(c)
    kv.free(filler)
    assert kv.allocate_slots(c, 1, hits) is not None
    assert c.block_ids[:2] == [1, 2]


def test_allocate_grows_incrementally_and_returns_none_when_full():
    kv = KVCacheManager(4, BS)   # 3 usable
    r = req("r", range(5))
    assert [b.block_id for b in kv.allocate_slots(r, 3)] == [1]
    r.num_computed_tokens = 3
    assert kv.allocate_slots(r, 1) == []          # still inside block 1
    r.num_computed_tokens = 4
    assert [b.block_id for b in kv.allocate_slots(r, 5)] == [2, 3]
    r.num_computed_tokens = 9
    assert kv.allocate_slots(r, 4) is None        # would need a 4th block
    assert r.block_ids == [1, 2, 3]
    kv.free(r)
    assert kv.block_pool.free_block_ids() == [3, 2, 1]


def test_collision_is_verified_against_tokens(monkeypatch):
    monkeypatch.setattr(kvm, "hash_block_tokens", lambda parent, toks: 42)
    kv = KVCacheManager(10, BS)
    admit(kv, req("a", [1, 1, 1, 1, 2]))
    hits, n = kv.get_computed_blocks(req("b", [3, 3, 3, 3, 2]))  # same hash, other tokens
    assert hits == [] and n == 0
    hits, n = kv.get_computed_blocks(req("c", [1, 1, 1, 1, 7]))
    assert [h.block_id for h in hits] == [1] and n == 4


def test_caching_disabled_and_prompt_logits_skip_lookup():
    kv = KVCacheManager(10, BS, enable_caching=False)
    a = req("a", range(9))
    admit(kv, a)
    assert not kv.block_pool.cached_block_hash_to_block
    assert kv.get_computed_blocks(req("b", range(9))) == ([], 0)
    kv2 = KVCacheManager(10, BS)
    admit(kv2, req("a", range(9)))
    assert kv2.get_computed_blocks(req("b", range(9), want_prompt_logits=True)) == ([], 0)
    assert kv2.get_computed_blocks(req("c", range(9)))[1] == 8


def test_cache_blocks_only_full_blocks_up_to_computed():
    kv = KVCacheManager(10, BS)
    r = req("r", range(11))
    kv.allocate_slots(r, 6)            # a chunk of 6 tokens: blocks 1, 2
    kv.cache_blocks(r, 6)
    assert kv.block_pool.cached_block_ids() == {1}
    r.num_computed_tokens = 6
    kv.allocate_slots(r, 5)
    kv.cache_blocks(r, 11)
    assert kv.block_pool.cached_block_ids() == {1, 2}
    r.num_computed_tokens = 11
    r.output_token_ids.append(99)
    kv.allocate_slots(r, 1)
    kv.cache_blocks(r, 12)            # decode filled block 3 (with an output token)
    assert kv.block_pool.cached_block_ids() == {1, 2, 3}
    assert kv.block_pool.blocks[3].token_ids == (8, 9, 10, 99)


def test_lookup_stats_in_tokens():
    kv = KVCacheManager(10, BS)
    a = req("a", range(9))
    admit(kv, a)
    kv.record_lookup(a, 0)
    b = req("b", range(9))
    n = admit(kv, b)[0]
    kv.record_lookup(b, n)
    assert (kv.prefix_cache_requests, kv.prefix_cache_queries, kv.prefix_cache_hits) == (2, 18, 8)


def test_bad_block_size():
    with pytest.raises(ValueError, match="block_size"):
        KVCacheManager(4, 0)


def test_a_pending_token_holds_back_its_block_hash():
    """Async scheduling: a block that a PENDING_TOKEN fills is neither hashed nor cached until the
    token is known; the next cache_blocks call enters it."""
    from pocketcupy.sched.request import PENDING_TOKEN

    kv = KVCacheManager(10, BS)
    a = req("a", range(7))
    admit(kv, a)                                          # blocks 1 (full, cached) and 2 (3 of 4 tokens)
    a.output_token_ids.append(PENDING_TOKEN)              # launched: its token not on the host yet
    assert kv.allocate_slots(a, 1) == []
    kv.cache_blocks(a, 8)
    assert len(a.block_hashes) == 1 and kv.block_pool.blocks[2].block_hash is None
    a.output_token_ids[-1] = 70                           # the token arrived
    a.num_computed_tokens = 8
    a.output_token_ids.append(PENDING_TOKEN)
    kv.allocate_slots(a, 1)
    kv.cache_blocks(a, 9)
    assert a.block_hashes[1] == hash_block_tokens(a.block_hashes[0], (4, 5, 6, 70))
    assert kv.block_pool.blocks[2].block_hash == a.block_hashes[1]
    b = req("b", [0, 1, 2, 3, 4, 5, 6, 70, 71])
    assert kv.get_computed_blocks(b)[1] == 8
