"""Per-iteration batch policy for one instance, engine-neutral.

An engine calls :meth:`ContinuousBatchPolicy.schedule` once per iteration with light
:class:`SeqState` records and applies the returned :class:`BatchPlan`. Rules, in order:

1. Decode first: every running sequence past its prompt decodes one token, highest
   priority first, then earliest arrival. A decode may ask for look-ahead slots
   (``SeqState.num_lookahead``: speculative draft tokens verified in the same forward); they
   are granted in the same order while the token budget and the free blocks allow, never by
   preempting anyone, and count against both (``BatchPlan.lookahead``).
2. KV pressure: when the free blocks do not cover the decode slots, the lowest-priority,
   latest-arrived running sequence is preempted by recompute (its blocks are freed; the
   engine drops its KV and requeues it) until they do.
3. Prefill under a token budget ``max_batched_tokens - num_decodes``: partially prefilled
   running sequences continue first, then waiting ones are admitted in priority order
   while ``max_num_seqs`` and the free blocks allow. With ``chunked_prefill`` a prompt is
   cut to the remaining budget; without it a prompt is taken whole or not at all (a prompt
   larger than the whole budget is still taken alone so it cannot starve).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["BatchConfig", "BatchPlan", "ContinuousBatchPolicy", "SeqState"]


@dataclass(frozen=True, slots=True)
class SeqState:
    """One sequence as the batch policy sees it.

    ``prompt_len`` is the number of tokens to prefill before decoding (after a preemption by
    recompute the engine passes the prompt plus the tokens generated so far);
    ``num_computed_tokens`` is how many tokens have KV in the cache (prefix-cache hits
    included); ``priority``: larger is more important; ``arrival`` orders equal priorities.
    ``num_lookahead``: extra slots a decode asks for past its next token (speculative drafts
    to verify in the same forward).
    """

    seq_id: int
    prompt_len: int
    num_computed_tokens: int = 0
    num_generated: int = 0
    max_tokens: int = 1
    priority: int = 0
    arrival: float = 0.0
    num_lookahead: int = 0

    def __post_init__(self) -> None:
        if self.num_lookahead < 0:
            raise ValueError(f"num_lookahead must be >= 0, got {self.num_lookahead}")
        if self.prompt_len < 1:
            raise ValueError(f"prompt_len must be >= 1, got {self.prompt_len}")
        if self.num_computed_tokens < 0 or self.num_generated < 0:
            raise ValueError("num_computed_tokens and num_generated must be >= 0")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")

    @property
    def in_prefill(self) -> bool:
        """True while part of the prompt still lacks KV."""
        return self.num_computed_tokens < self.prompt_len


@dataclass(frozen=True)
class BatchConfig:
    """Limits of one iteration: sequences in flight, tokens per forward, chunking."""

    max_num_seqs: int = 256
    max_batched_tokens: int = 8192
    chunked_prefill: bool = True

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_batched_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"BatchConfig.{name} must be an integer, got {v!r}")
        if not isinstance(self.chunked_prefill, bool):
            raise TypeError(
                f"BatchConfig.chunked_prefill must be true or false, got {self.chunked_prefill!r}"
            )
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_batched_tokens < 1:
            raise ValueError(f"max_batched_tokens must be >= 1, got {self.max_batched_tokens}")


@dataclass
class BatchPlan:
    """What to run this iteration: prompt chunks, decode steps, and preempted sequences.

    ``lookahead``: look-ahead slots granted to decodes (absent: none), past their next token.
    """

    prefill_chunks: list[tuple[int, int]] = field(default_factory=list)
    decode_ids: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    lookahead: dict[int, int] = field(default_factory=dict)

    @property
    def num_batched_tokens(self) -> int:
        """Tokens in the forward pass: one per decode, its look-ahead slots, every prefill
        chunk."""
        return (
            len(self.decode_ids)
            + sum(self.lookahead.values())
            + sum(n for _, n in self.prefill_chunks)
        )


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def _order(s: SeqState) -> tuple[int, float, int]:
    return (-s.priority, s.arrival, s.seq_id)


class ContinuousBatchPolicy:
    """Continuous batching with decode first, chunked prefill, priorities and preemption."""

    __slots__ = ("config",)

    def __init__(self, config: BatchConfig | None = None) -> None:
        self.config = config or BatchConfig()

    def schedule(
        self,
        waiting: Sequence[SeqState],
        running: Sequence[SeqState],
        free_kv_blocks: int,
        block_size: int,
    ) -> BatchPlan:
        """Plan one iteration; see the module docstring for the rules."""
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if free_kv_blocks < 0:
            raise ValueError(f"free_kv_blocks must be >= 0, got {free_kv_blocks}")
        cfg = self.config
        plan = BatchPlan()
        free = free_kv_blocks
        alive = sorted(running, key=_order)
        decodes = [s for s in alive if not s.in_prefill]
        # A decode needs a fresh block exactly when its KV length sits on a block boundary.
        need = sum(1 for s in decodes if s.num_computed_tokens % block_size == 0)
        while need > free and alive:
            victim = alive.pop()
            plan.preempted.append(victim.seq_id)
            free += _blocks(victim.num_computed_tokens, block_size)
            if not victim.in_prefill:
                decodes.remove(victim)
                need -= victim.num_computed_tokens % block_size == 0
        free -= need
        plan.decode_ids = [s.seq_id for s in decodes]
        budget = cfg.max_batched_tokens - len(decodes)
        for s in decodes:
            if s.num_lookahead <= 0 or budget <= 0:
                continue
            # Blocks past the ones the decode token itself needs; trimmed to what is free.
            base = _blocks(s.num_computed_tokens + 1, block_size)
            room = (base + free) * block_size - s.num_computed_tokens - 1
            slots = min(s.num_lookahead, budget, room)
            if slots > 0:
                plan.lookahead[s.seq_id] = slots
                free -= _blocks(s.num_computed_tokens + 1 + slots, block_size) - base
                budget -= slots
        in_flight = len(alive)
        candidates = [s for s in alive if s.in_prefill] + sorted(waiting, key=_order)
        for i, s in enumerate(candidates):
            if budget <= 0:
                break
            is_new = i >= len(candidates) - len(waiting)
            if is_new and in_flight >= cfg.max_num_seqs:
                break
            remaining = s.prompt_len - s.num_computed_tokens
            if remaining <= 0:
                continue
            if cfg.chunked_prefill:
                chunk = min(remaining, budget)
            elif remaining <= budget or (not plan.prefill_chunks and not plan.decode_ids):
                chunk = remaining
            else:
                break
            held = _blocks(s.num_computed_tokens, block_size)
            extra = _blocks(s.num_computed_tokens + chunk, block_size) - held
            if extra > free:
                if not cfg.chunked_prefill:
                    break
                chunk = (held + free) * block_size - s.num_computed_tokens
                if chunk <= 0:
                    break
                extra = free
            plan.prefill_chunks.append((s.seq_id, chunk))
            free -= extra
            budget -= chunk
            if is_new:
                in_flight += 1
        return plan
