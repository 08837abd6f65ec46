"""Fixed-size KV blocks: reference counts, an LRU free queue and the prefix-cache hash map.

Block 0 is the null block: it is never handed out (block tables are padded with it). A block
whose reference count drops to 0 goes to the tail of the free queue but keeps its hash, so a
later request with the same prefix can take it back (`touch`) until it is evicted, which
happens when `get_new_blocks` pops it from the head of the queue.
"""
from __future__ import annotations

from typing import Iterable


class KVCacheBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash", "parent_hash", "token_ids",
                 "prev_free_block", "next_free_block", "is_null")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None          # set while the block is in the prefix cache
        self.parent_hash: int | None = None         # what the hash was chained on (verified on a hit)
        self.token_ids: tuple[int, ...] | None = None
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None
        self.is_null = False

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, hash={self.block_hash})"


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks in eviction order (head = evicted first). O(1) removal
    from the middle, which is what a prefix hit on a free cached block needs."""

    def __init__(self, blocks: list[KVCacheBlock]):
        self.num_free_blocks = len(blocks)
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        prev = self._head
        for b in blocks:
            prev.next_free_block, b.prev_free_block = b, prev
            prev = b
        prev.next_free_block, self._tail.prev_free_block = self._tail, prev

    def popleft(self) -> KVCacheBlock:
        b = self._head.next_free_block
        if b is self._tail:
            raise ValueError("no free blocks")
        self.remove(b)
        return b

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        return [self.popleft() for _ in range(n)]

    def remove(self, b: KVCacheBlock) -> None:
        if b.prev_free_block is None or b.next_free_block is None:
            raise RuntimeError(f"block {b.block_id} is not in the free queue")
        b.prev_free_block.next_free_block = b.next_free_block
        b.next_free_block.prev_free_block = b.prev_free_block
        b.prev_free_block = b.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, b: KVCacheBlock) -> None:
        last = self._tail.prev_free_block
        last.next_free_block, b.prev_free_block = b, last
        b.next_free_block, self._tail.prev_free_block = self._tail, b
        self.num_free_blocks += 1

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        for b in blocks:
            self.append(b)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        out, b = [], self._head.next_free_block
        while b is not self._tail:
            out.append(b)
            b = b.next_free_block
        return out

    def __len__(self) -> int:
        return self.num_free_blocks


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True):
        if not isinstance(num_blocks, int) or num_blocks < 2:
            raise ValueError(f"num_kv_blocks: must be >= 2 (block 0 is the reserved null block), got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        # hash -> {block_id: block}: equal hashes may map to several blocks (a prefix computed twice)
        self.cached_block_hash_to_block: dict[int, dict[int, KVCacheBlock]] = {}
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.num_evictions = 0

    # --- sizes ---------------------------------------------------------------------------
    @property
    def num_usable_blocks(self) -> int:
        """Blocks that can be handed out (all but the null block)."""
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        """Free blocks, cached ones with no reference included (they are evictable)."""
        return self.free_block_queue.num_free_blocks

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free / self.num_usable_blocks

    def free_block_ids(self) -> list[int]:
        """Ids of the free blocks in eviction order (first = evicted first)."""
        return [b.block_id for b in self.free_block_queue.get_all_free_blocks()]

    def cached_block_ids(self) -> set[int]:
        return {bid for d in self.cached_block_hash_to_block.values() for bid in d}

    # --- prefix cache --------------------------------------------------------------------
    def get_cached_block(self, block_hash: int, parent_hash: int | None,
                         token_ids: tuple[int, ...]) -> KVCacheBlock | None:
        """A cached block with this hash whose tokens and parent hash really match, or None."""
        for b in self.cached_block_hash_to_block.get(block_hash, {}).values():
            if b.token_ids == token_ids and b.parent_hash == parent_hash:
                return b
        return None

    def cache_full_block(self, block: KVCacheBlock, block_hash: int, parent_hash: int | None,
                         token_ids: tuple[int, ...]) -> None:
        if block.block_hash is not None or block.is_null:
            raise RuntimeError(f"block {block.block_id} is already cached or is the null block")
        block.block_hash, block.parent_hash, block.token_ids = block_hash, parent_hash, token_ids
        self.cached_block_hash_to_block.setdefault(block_hash, {})[block.block_id] = block

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        if block.block_hash is None:
            return False
        bucket = self.cached_block_hash_to_block.get(block.block_hash)
        if bucket is not None:
            bucket.pop(block.block_id, None)
            if not bucket:
                del self.cached_block_hash_to_block[block.block_hash]
        block.block_hash = block.parent_hash = block.token_ids = None
        self.num_evictions += 1
        return True

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; only possible when no block is in use."""
        if self.num_free != self.num_usable_blocks:
            return False
        for b in self.blocks:
            b.block_hash = b.parent_hash = b.token_ids = None
        self.cached_block_hash_to_block.clear()
        return True

    # --- allocation ----------------------------------------------------------------------
    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        """Pops n blocks from the head of the free queue (evicting their cached hashes)."""
        if n > self.num_free:
            raise ValueError(f"cannot get {n} free blocks from the pool ({self.num_free} free)")
        out = self.free_block_queue.popleft_n(n)
        for b in out:
            assert b.ref_cnt == 0
            self._maybe_evict_cached_block(b)
            b.ref_cnt = 1
        return out

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Takes a reference on blocks found in the prefix cache (out of the free queue if free)."""
        for b in blocks:
            if b.ref_cnt == 0 and not b.is_null:
                self.free_block_queue.remove(b)
            b.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drops a reference on each block; blocks reaching 0 join the free queue's tail in
        the order given (so the first given is evicted first)."""
        for b in ordered_blocks:
            if b.ref_cnt <= 0:
                raise RuntimeError(f"block {b.block_id} freed more often than it was taken")
            b.ref_cnt -= 1
            if b.ref_cnt == 0 and not b.is_null:
                self.free_block_queue.append(b)
