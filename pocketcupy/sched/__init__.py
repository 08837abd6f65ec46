"""Scheduling in pure Python (no arrays): requests, KV blocks, prefix cache, the step scheduler."""
from .block_pool import BlockPool, FreeKVCacheBlockQueue, KVCacheBlock
from .kv_cache_manager import KVCacheManager, hash_block_tokens
from .output import ScheduledRequest, SchedulerOutput
from .request import Request, RequestStatus
from .scheduler import POLICIES, RequestQueue, Scheduler

__all__ = ["BlockPool", "FreeKVCacheBlockQueue", "KVCacheBlock", "KVCacheManager", "hash_block_tokens",
           "ScheduledRequest", "SchedulerOutput", "Request", "RequestStatus", "POLICIES", "RequestQueue",
           "Scheduler"]
