"""BlockPool and its free queue: exact block ids and eviction order."""
import pytest

from pocketcupy.sched.block_pool import BlockPool, FreeKVCacheBlockQueue, KVCacheBlock


def cache(pool, block, h, parent=None, toks=(0,)):
    pool.cache_full_block(block, h, parent, toks)


def test_null_block_is_reserved():
    pool = BlockPool(6)
    assert pool.null_block.block_id == 0 and pool.null_block.is_null
    assert pool.free_block_ids() == [1, 2, 3, 4, 5]
    assert pool.num_usable_blocks == 5 and pool.num_free == 5
    assert [b.block_id for b in pool.get_new_blocks(5)] == [1, 2, 3, 4, 5]
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)  # the null block is never handed out


@pytest.mark.parametrize("n", [0, 1, -3])
def test_too_small_pool(n):
    with pytest.raises(ValueError, match="num_kv_blocks"):
        BlockPool(n)


def test_allocate_free_order():
    pool = BlockPool(8)
    a = pool.get_new_blocks(3)
    b = pool.get_new_blocks(2)
    assert [x.block_id for x in a] == [1, 2, 3] and [x.block_id for x in b] == [4, 5]
    assert all(x.ref_cnt == 1 for x in a + b)
    assert pool.free_block_ids() == [6, 7]
    pool.free_blocks(reversed(a))  # a request frees its blocks tail first
    assert pool.free_block_ids() == [6, 7, 3, 2, 1]
    pool.free_blocks(b)
    assert pool.free_block_ids() == [6, 7, 3, 2, 1, 4, 5]
    assert [x.block_id for x in pool.get_new_blocks(4)] == [6, 7, 3, 2]
    assert pool.free_block_ids() == [1, 4, 5]
    assert pool.usage == pytest.approx(4 / 7)


def test_shared_block_freed_only_at_zero_refs():
    pool = BlockPool(5)
    blk = pool.get_new_blocks(1)[0]
    cache(pool, blk, 11)
    pool.touch([blk])
    assert blk.ref_cnt == 2
    pool.free_blocks([blk])
    assert blk.ref_cnt == 1 and pool.free_block_ids() == [2, 3, 4]
    pool.free_blocks([blk])
    assert pool.free_block_ids() == [2, 3, 4, 1]
    with pytest.raises(RuntimeError):
        pool.free_blocks([blk])


def test_cached_block_survives_free_until_evicted():
    pool = BlockPool(5)
    b1, b2 = pool.get_new_blocks(2)
    cache(pool, b1, 100, None, (1, 2))
    cache(pool, b2, 200, 100, (3, 4))
    pool.free_blocks([b2, b1])
    assert pool.free_block_ids() == [3, 4, 2, 1]
    assert pool.get_cached_block(100, None, (1, 2)) is b1
    assert pool.get_cached_block(200, 100, (3, 4)) is b2
    # a hit takes a free cached block out of the middle of the queue
    pool.touch([b1])
    assert b1.ref_cnt == 1 and pool.free_block_ids() == [3, 4, 2]
    pool.free_blocks([b1])
    assert pool.free_block_ids() == [3, 4, 2, 1]
    # allocation pops from the head; popping a cached block evicts its hash
    got = pool.get_new_blocks(3)
    assert [b.block_id for b in got] == [3, 4, 2]
    assert pool.get_cached_block(200, 100, (3, 4)) is None and b2.block_hash is None
    assert pool.get_cached_block(100, None, (1, 2)) is b1
    assert pool.num_evictions == 1
    assert pool.cached_block_ids() == {1}


def test_cached_lookup_verifies_tokens_and_parent():
    pool = BlockPool(4)
    b = pool.get_new_blocks(1)[0]
    cache(pool, b, 7, 5, (1, 2, 3))
    assert pool.get_cached_block(7, 5, (1, 2, 3)) is b
    assert pool.get_cached_block(7, 5, (1, 2, 4)) is None    # hash collision, other tokens
    assert pool.get_cached_block(7, 6, (1, 2, 3)) is None    # same tokens after another prefix
    assert pool.get_cached_block(8, 5, (1, 2, 3)) is None


def test_same_hash_several_blocks():
    pool = BlockPool(4)
    x, y = pool.get_new_blocks(2)
    cache(pool, x, 9, None, (1,))
    cache(pool, y, 9, None, (1,))
    assert pool.cached_block_hash_to_block[9].keys() == {1, 2}
    pool.free_blocks([x, y])
    pool.get_new_blocks(2)  # 3, then 1 (evicted); 2 stays cached
    assert pool.get_cached_block(9, None, (1,)) is y
    with pytest.raises(RuntimeError):
        cache(pool, y, 10)  # already cached


def test_reset_prefix_cache():
    pool = BlockPool(4)
    b = pool.get_new_blocks(1)[0]
    cache(pool, b, 1)
    assert not pool.reset_prefix_cache()  # a block is in use
    pool.free_blocks([b])
    assert pool.reset_prefix_cache()
    assert pool.get_cached_block(1, None, (0,)) is None and b.block_hash is None


def test_free_queue_linked_list():
    blocks = [KVCacheBlock(i) for i in range(5)]
    q = FreeKVCacheBlockQueue(blocks)
    assert len(q) == 5
    q.remove(blocks[2])
    q.remove(blocks[0])
    q.append(blocks[2])
    assert [b.block_id for b in q.get_all_free_blocks()] == [1, 3, 4, 2]
    assert [b.block_id for b in q.popleft_n(2)] == [1, 3]
    q.append_n([blocks[0], blocks[1]])
    assert [b.block_id for b in q.get_all_free_blocks()] == [4, 2, 0, 1]
    with pytest.raises(RuntimeError):
        q.remove(blocks[3])  # not in the queue
    q.popleft_n(4)
    with pytest.raises(ValueError):
        q.popleft()
    assert len(q) == 0
