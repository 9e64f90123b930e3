"""deepinfer_cache: a tiered GPU/CPU/SSD prefix KV store that survives crashes (docs/cache.md).

Example::

    import torch
    from deepinfer_cache import DiskTier, HostTier, TieredKVStore

    page = (2, 16, 4, 8)                       # e.g. [K/V, block_size, heads, head_dim]
    tiers = [HostTier(page, torch.bfloat16, 64 << 20),
             DiskTier("/tmp/kv", page, torch.bfloat16, 1 << 30)]
    with TieredKVStore(tiers, block_size=16) as store:
        tokens = list(range(100))              # 6 full blocks
        store.store(tokens, torch.zeros(6, *page, dtype=torch.bfloat16), retention="agent")
        print(store.lookup(tokens).num_tokens)  # 96
"""

from .adapter import KVCacheAdapter
from .block_hash_chain import BlockHashChain
from .clock import Clock, FakeClock, SystemClock
from .config import PrefixCacheConfig, build_store, default_kv_directory
from .disk_format import CorruptBlockError
from .events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CacheEvent,
    EventSubscription,
)
from .hashing import (
    DEFAULT_KEY_HASH,
    KEY_HASHES,
    BlockHash,
    check_key_hash,
    hash_blocks_from,
    hash_token_blocks,
    iter_block_hashes,
)
from .index import MatchResult, PrefixIndex
from .lockfile import CacheLockedError
from .meta import BlockMeta
from .page_pool import PagePool, PagePoolStats
from .pool_cache import build_pool_cache, pool_model_key
from .results import FetchResult, LookupResult
from .retention import RetentionPolicy
from .sizing import REFERENCE_MODELS, ModelKV, SizingResult, ssd_capacity
from .stats import CostReport, StoreStats, TierStats
from .store import TieredKVStore
from .tiers import (
    DISK_FORMATS,
    CacheFormatError,
    DeviceTier,
    DiskTier,
    HostTier,
    MigrationReport,
    SegmentDiskTier,
    Tier,
    torch_gather,
    torch_scatter,
)

__version__ = "0.9.1"

__all__ = [
    "DEFAULT_KEY_HASH",
    "DISK_FORMATS",
    "KEY_HASHES",
    "REFERENCE_MODELS",
    "AllBlocksCleared",
    "BlockHash",
    "BlockHashChain",
    "BlockMeta",
    "BlockRemoved",
    "BlockStored",
    "CacheEvent",
    "CacheFormatError",
    "CacheLockedError",
    "Clock",
    "CorruptBlockError",
    "CostReport",
    "DeviceTier",
    "DiskTier",
    "EventSubscription",
    "FakeClock",
    "FetchResult",
    "HostTier",
    "KVCacheAdapter",
    "LookupResult",
    "MatchResult",
    "MigrationReport",
    "ModelKV",
    "PagePool",
    "PagePoolStats",
    "PrefixCacheConfig",
    "PrefixIndex",
    "RetentionPolicy",
    "SegmentDiskTier",
    "SizingResult",
    "StoreStats",
    "SystemClock",
    "Tier",
    "TierStats",
    "TieredKVStore",
    "__version__",
    "build_pool_cache",
    "build_store",
    "check_key_hash",
    "default_kv_directory",
    "hash_blocks_from",
    "hash_token_blocks",
    "iter_block_hashes",
    "pool_model_key",
    "ssd_capacity",
    "torch_gather",
    "torch_scatter",
]
