"""Per-request block tables over the BlockPool, with prefix caching.

Block hashes chain over full blocks only: hash((parent_hash, tuple(block_token_ids))), with
parent None for the first block, so a hit on block i implies the whole prefix up to block i
matches. A hit is also verified against the stored token ids and parent hash.
"""
from __future__ import annotations

from .block_pool import BlockPool, KVCacheBlock
from .request import PENDING_TOKEN, Request


def hash_block_tokens(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((parent_hash, token_ids))


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 recompute_last_hit_block: bool = False):
        """recompute_last_hit_block: a hit leaves its last block to compute again (vLLM does so for
        EAGLE / MTP drafts: a drafter that reads the target's hidden states gets them for that
        block's positions, the last of which its cached rows saw with the computing request's next
        token, which may not be this request's)."""
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size: must be a positive integer, got {block_size!r}")
        self.block_size = block_size
        self.enable_caching, self.recompute_last_hit_block = enable_caching, recompute_last_hit_block
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}    # leading blocks of a request already hashed
        self.prefix_cache_requests = 0                 # lookups
        self.prefix_cache_queries = 0                  # tokens looked up
        self.prefix_cache_hits = 0                     # tokens found
        self.prefix_cache_preempted_queries = 0        # the same for lookups of preempted requests
        self.prefix_cache_preempted_hits = 0

    # --- hashes --------------------------------------------------------------------------
    def update_block_hashes(self, req: Request) -> list[int]:
        """Extends `req.block_hashes` to every full block of the request's known tokens (up to the
        first block holding a PENDING_TOKEN, whose id is not known yet)."""
        bs, hashes = self.block_size, req.block_hashes
        n_full = req.num_tokens // bs
        if len(hashes) < n_full:
            toks = req.all_token_ids
            parent = hashes[-1] if hashes else None
            for i in range(len(hashes), n_full):
                block = tuple(toks[i * bs:(i + 1) * bs])
                if PENDING_TOKEN in block:
                    break
                parent = hash_block_tokens(parent, block)
                hashes.append(parent)
        return hashes

    def _block_tokens(self, req: Request, i: int) -> tuple[int, ...]:
        return tuple(req.token_slice(i * self.block_size, (i + 1) * self.block_size))

    # --- the interface -------------------------------------------------------------------
    def get_computed_blocks(self, req: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest run of leading full blocks of `req` found in the prefix cache, and the
        number of tokens they hold. Never the whole request: its last token is always left to
        compute, so there are logits to sample from. Takes no references (allocate_slots does)."""
        if not self.enable_caching or req.want_prompt_logits:
            return [], 0  # prompt logits need every prompt row computed
        hashes = self.update_block_hashes(req)
        max_blocks = (req.num_tokens - 1) // self.block_size
        hits: list[KVCacheBlock] = []
        parent = None
        for i in range(min(max_blocks, len(hashes))):
            b = self.block_pool.get_cached_block(hashes[i], parent, self._block_tokens(req, i))
            if b is None:
                break
            hits.append(b)
            parent = hashes[i]
        if self.recompute_last_hit_block and hits:
            hits.pop()
        return hits, len(hits) * self.block_size

    def record_lookup(self, req: Request, num_hit_tokens: int) -> None:
        """Counts one prefix-cache lookup that was used (the scheduler calls it on admission,
        so a request blocked at the head of the queue is not counted every step). A preempted
        request's lookups, which find its own blocks, are counted apart (as vLLM does)."""
        if not self.enable_caching or req.want_prompt_logits:
            return
        if req.num_preemptions:
            self.prefix_cache_preempted_queries += req.num_tokens
            self.prefix_cache_preempted_hits += num_hit_tokens
            return
        self.prefix_cache_requests += 1
        self.prefix_cache_queries += req.num_tokens
        self.prefix_cache_hits += num_hit_tokens

    def allocate_slots(self, req: Request, num_new_tokens: int,
                       new_computed_blocks: list[KVCacheBlock] | None = None) -> list[KVCacheBlock] | None:
        """Grows the request's block table to hold num_computed_tokens + len(new_computed_blocks)
        full blocks + num_new_tokens tokens. Returns the newly allocated blocks, or None (and
        changes nothing) when the pool cannot supply them."""
        computed = new_computed_blocks or []
        blocks = self.req_to_blocks.setdefault(req.request_id, [])
        if computed and blocks:
            raise RuntimeError(f"{req.request_id}: prefix hits are only taken by a request without blocks")
        total = req.num_computed_tokens + len(computed) * self.block_size + num_new_tokens
        need = -(-total // self.block_size) - len(blocks) - len(computed)
        if need <= 0 and not computed:  # most decode steps: the last block still has room
            return []
        evictable = sum(1 for b in computed if b.ref_cnt == 0)
        if need > self.block_pool.num_free - evictable:
            if not blocks:
                del self.req_to_blocks[req.request_id]
            return None
        if computed:
            self.block_pool.touch(computed)   # before get_new_blocks can evict them
            blocks.extend(computed)
            self.num_cached_block[req.request_id] = len(computed)
        new = self.block_pool.get_new_blocks(need) if need > 0 else []
        blocks.extend(new)
        req.block_ids = [b.block_id for b in blocks]
        return new

    def cache_blocks(self, req: Request, num_tokens: int) -> None:
        """Puts the request's blocks that are full once its first `num_tokens` tokens are
        computed into the prefix cache (called when those tokens are scheduled)."""
        if not self.enable_caching:
            return
        rid = req.request_id
        blocks = self.req_to_blocks.get(rid, [])
        start = self.num_cached_block.get(rid, 0)
        n_full = min(num_tokens // self.block_size, len(blocks))
        if n_full <= start:
            return
        hashes = self.update_block_hashes(req)
        n_full = min(n_full, len(hashes))    # a block with a pending token waits for a later call
        for i in range(start, n_full):
            b = blocks[i]
            if b.block_hash is None:
                parent = hashes[i - 1] if i else None
                self.block_pool.cache_full_block(b, hashes[i], parent, self._block_tokens(req, i))
        self.num_cached_block[rid] = n_full

    def free(self, req: Request) -> None:
        """Drops the request's references; its tail blocks become the first to be evicted."""
        blocks = self.req_to_blocks.pop(req.request_id, [])
        self.num_cached_block.pop(req.request_id, None)
        self.block_pool.free_blocks(reversed(blocks))
        req.block_ids = []

    # --- views ---------------------------------------------------------------------------
    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, [])]

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free

    @property
    def num_used_blocks(self) -> int:
        return self.block_pool.num_usable_blocks - self.block_pool.num_free

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()
