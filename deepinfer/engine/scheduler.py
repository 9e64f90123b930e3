"""`Scheduler`: which sequences run each step, and the KV blocks they hold.

It admits waiting sequences (a cached prefix that the cache's device tier holds in this pool is
shared by reference count, any other is copied in through the `PrefixCache` seam),
reserves blocks for the tokens and look-ahead slots the batch policy grants, preempts by
recompute when blocks run out, and frees (after saving full blocks to the prefix cache) what
finished sequences held. The plan itself comes from ``deepinfer_sched``'s batch policy.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from deepinfer.engine.chunk import Chunk
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.prefix_cache import PrefixCache, SharesDeviceBlocks, block_hashes
from deepinfer.engine.sequence import SeqStatus, Sequence
from deepinfer.models.kv_pool import KVPool
from deepinfer_sched.policies.batch import BatchConfig, ContinuousBatchPolicy, SeqState


class Scheduler:
    """Owns the KV pool's blocks on behalf of the sequences in flight.

    ``lookahead(seq)``: draft slots a decoding sequence asks for (a speculator's
    ``num_lookahead``); ``on_release(seq_id)``: called when a sequence's KV is dropped.
    """

    def __init__(
        self,
        config: EngineConfig,
        pool: KVPool,
        prefix_cache: PrefixCache | None = None,
        *,
        lookahead: Callable[[Sequence], int] | None = None,
        on_release: Callable[[int], None] | None = None,
    ) -> None:
        if pool.block_size != config.block_size:
            raise ValueError(f"pool.block_size {pool.block_size} != {config.block_size}")
        self.config = config
        self.pool = pool
        self.prefix_cache = prefix_cache
        self.lookahead = lookahead
        self.on_release = on_release
        self.policy = ContinuousBatchPolicy(
            BatchConfig(
                max_num_seqs=config.max_num_seqs,
                max_batched_tokens=config.max_batched_tokens,
                chunked_prefill=config.chunked_prefill,
            )
        )
        # Blocks a prefix cache's device tier reserved are not ours to hand out.
        self.capacity_blocks = pool.num_free_blocks
        self.seqs: dict[int, Sequence] = {}
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        # Per sequence sharing device-tier blocks: releases the cache's pin on them.
        self._leases: dict[int, Callable[[], None]] = {}

    def add(self, seq: Sequence) -> None:
        self.seqs[seq.seq_id] = seq
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ one step
    def schedule(self) -> list[Chunk]:
        """Plan this step: preempt, admit, reserve; the chunks to run (maybe none)."""
        plan = self.policy.schedule(
            [self._state(s) for s in self.waiting],
            [self._state(s) for s in self.running],
            self.pool.num_free_blocks,
            self.config.block_size,
        )
        for seq_id in plan.preempted:
            self._preempt(self.seqs[seq_id])
        chunks: list[Chunk] = []
        for seq_id in plan.decode_ids:
            seq = self.seqs[seq_id]
            extra = plan.lookahead.get(seq_id, 0)
            if extra and not self.reserve(seq, seq.num_computed + 1 + extra):
                extra = 0
            if self.reserve(seq, seq.num_computed + 1):
                chunks.append(Chunk(seq, seq.num_computed, 1, extra))
        for seq_id, length in plan.prefill_chunks:
            seq = self.seqs[seq_id]
            if seq.status is SeqStatus.WAITING:
                self._admit(seq)
            length = min(length, seq.prefill_target - seq.num_computed)
            if length > 0 and self.reserve(seq, seq.num_computed + length):
                chunks.append(Chunk(seq, seq.num_computed, length))
        return chunks

    def reserve(self, seq: Sequence, num_tokens: int) -> bool:
        """Give ``seq`` blocks for ``num_tokens`` tokens of KV, if the pool has them."""
        need = seq.blocks_needed(num_tokens, self.config.block_size)
        if need > self.pool.num_free_blocks:
            return False
        seq.block_ids.extend(self.pool.allocate(need))
        return True

    def start_running(self, seq: Sequence) -> None:
        self.waiting.remove(seq)
        self.running.append(seq)
        seq.status = SeqStatus.RUNNING

    def finish(self, seq: Sequence, reason: str, *, save: bool) -> None:
        """Drop a sequence; ``save``: first keep its full computed blocks in the prefix cache."""
        bs = self.config.block_size
        if save and self.prefix_cache is not None and seq.num_computed >= bs:
            # Keep every full block of this conversation so its next turn hits.
            self.prefix_cache.save(
                seq.all_ids[: seq.num_computed],
                seq.namespace,
                seq.block_ids,
                seq.params.retention,
                **block_hashes(self.prefix_cache, seq),
            )
        self._drop_kv(seq)
        if seq in self.running:
            self.running.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        del self.seqs[seq.seq_id]

    # ------------------------------------------------------------------ internals
    def _state(self, seq: Sequence) -> SeqState:
        # A waiting sequence's cached prefix is only looked up (and counted) when it is admitted.
        decoding = seq.status is SeqStatus.RUNNING and not seq.in_prefill
        return SeqState(
            seq_id=seq.seq_id,
            prompt_len=seq.prefill_target,
            num_computed_tokens=seq.num_computed,
            num_generated=len(seq.output_ids),
            max_tokens=seq.params.max_tokens,
            priority=seq.priority,
            arrival=seq.metrics.arrival_time,
            num_lookahead=self.lookahead(seq) if decoding and self.lookahead else 0,
        )

    def _admit(self, seq: Sequence) -> None:
        """Move a waiting sequence to running, loading its cached prefix into fresh blocks."""
        bs = self.config.block_size
        cache = self.prefix_cache
        # Prompt log-probabilities need every prompt position's logits: no cached prefix (vLLM).
        if cache is not None and seq.params.prompt_logprobs is None:
            # At least one token must be computed so the forward yields the next token's logits.
            usable = (seq.prefill_target - 1) // bs * bs
            hashes = block_hashes(cache, seq)  # kept on the sequence: no block hashed twice
            cached = min(cache.num_cached_tokens(seq.all_ids, seq.namespace, **hashes), usable)
            if cached and self._share(seq, cache, cached):
                pass
            elif cached:
                blocks = self.pool.allocate(min(cached // bs, self.pool.num_free_blocks))
                loaded = cache.load(seq.all_ids[:cached], seq.namespace, blocks, **hashes)
                keep = loaded // bs
                self.pool.free(blocks[keep:])
                seq.block_ids = blocks[:keep]
                seq.num_computed = keep * bs
                if seq.metrics.num_cached_tokens == 0:
                    seq.metrics.num_cached_tokens = seq.num_computed
        self.start_running(seq)

    def _share(self, seq: Sequence, cache: PrefixCache, cached: int) -> bool:
        """Use the device tier's blocks holding the whole cached prefix in place (one more
        reference each; full blocks, never written: the sequence's own tokens go to blocks
        after them). False, with nothing held, when the device tier lacks part of it."""
        if not isinstance(cache, SharesDeviceBlocks):
            return False
        bs = self.config.block_size
        blocks, release = cache.share(
            seq.all_ids[:cached], seq.namespace, cached // bs, **block_hashes(cache, seq)
        )
        if len(blocks) < cached // bs:
            release()
            return False
        self.pool.share(blocks)
        self._leases[seq.seq_id] = release
        seq.block_ids = list(blocks)
        seq.num_computed = cached
        if seq.metrics.num_cached_tokens == 0:
            seq.metrics.num_cached_tokens = cached
        return True

    def _drop_kv(self, seq: Sequence) -> None:
        self.pool.free(seq.block_ids)
        seq.block_ids = []
        release = self._leases.pop(seq.seq_id, None)
        if release is not None:
            release()
        if self.on_release is not None:
            self.on_release(seq.seq_id)

    def _preempt(self, seq: Sequence) -> None:
        """Drop a running sequence's KV; it re-prefills prompt + generated tokens later."""
        self._drop_kv(seq)
        seq.num_computed = 0
        seq.prefill_target = seq.num_tokens
        seq.status = SeqStatus.WAITING
        self.running.remove(seq)
        self.waiting.appendleft(seq)
