"""`LazyContext`: the drafter's per-sequence context in a continuous batch, projected lazily.

An engine's step reads new positions of many sequences at once (prefill chunks, decodes, the
anchor and accepted drafts of a verify block). The drafter attends to the last ``window`` of
each sequence's positions through the keys and values of its layers
(:meth:`DSparkDrafter.context_kv <deepinfer_spec.drafter.DSparkDrafter.context_kv>`), so what a
sequence needs is a ring of those entries. Computing them on every step would make a step that
does not draft (the draft gate is closed, the request cannot draft) pay the drafter's
projection anyway; instead a step only queues the target's raw features (:meth:`push`), and
they are projected, for every sequence that is about to draft at once, when it drafts
(:meth:`view`) or when a window's worth is pending (bounded memory).

Invariant: a tracked sequence's count (ring plus pending rows) is the number of its positions
the caller has reported. Positions the caller skipped (a prefix served from a cache) are
handled by :meth:`catch_up`: it tells the caller from which position to re-read features, at
most ``window`` back, and fills older positions with zeros that will never be attended to.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from deepinfer_spec.drafter import DSparkDrafter
from deepinfer_spec.state import ContextRing


class LazyContext:
    """Drafter context of up to ``max_seqs`` sequences, keyed by any hashable id.

    Args:
        drafter: the drafter whose ``project_context`` and ``context_kv`` build the entries.
        max_seqs: ring slots; a sequence that finds none free is simply not tracked (it cannot
            draft until one is released).
    """

    def __init__(self, drafter: DSparkDrafter, max_seqs: int) -> None:
        if not isinstance(max_seqs, int) or isinstance(max_seqs, bool) or max_seqs < 1:
            raise ValueError(f"max_seqs: expected a positive int, got {max_seqs!r}")
        weight = drafter.context_proj.weight
        self.drafter = drafter
        self.window = drafter.config.window
        self.device = weight.device
        self.ring = ContextRing(
            max_seqs, self.window, drafter.context_kv_dim, dtype=weight.dtype, device=weight.device
        )
        self._slots: dict[Hashable, int] = {}
        self._counts: dict[int, int] = {}  # per slot: positions seen (ring + pending)
        self._pending: dict[int, list[torch.Tensor]] = {}  # per slot: raw features
        self._free = list(range(max_seqs - 1, -1, -1))

    def slot(self, key: Hashable) -> int | None:
        """The ring slot of a tracked sequence (``None``: not tracked)."""
        return self._slots.get(key)

    def count(self, key: Hashable) -> int:
        """Positions of ``key`` reported so far (0 for an untracked sequence)."""
        slot = self._slots.get(key)
        return 0 if slot is None else self._counts[slot]

    def catch_up(self, key: Hashable, start: int) -> int | None:
        """Track ``key`` and return the first position whose features the caller must push
        this step, ``<= start`` (positions ``base .. start`` were never reported: a cached
        prefix). ``None`` when no slot is free (the sequence is not tracked)."""
        slot = self._track(key)
        if slot is None:
            return None
        count = self._counts[slot]
        if count > start:  # the sequence went back (recomputed from scratch): start over
            self._reset(slot)
            count = 0
        base = max(count, start - self.window)
        if count < base:  # positions older than the window are never attended: zeros
            gap = base - count
            self._flush([slot])
            zeros = torch.zeros(1, gap, self.ring.feature_dim, device=self.device)
            self.ring.append_slot(slot, zeros[0])
            self._counts[slot] += gap
        return base

    def push(self, key: Hashable, features: torch.Tensor) -> None:
        """Queue the target's raw features ``[T, F]`` of ``key``'s next ``T`` positions."""
        slot = self._slots.get(key)
        rows = int(features.shape[0])
        if slot is None or rows == 0:
            return
        pending = self._pending.setdefault(slot, [])
        pending.append(features)
        self._counts[slot] += rows
        # Bounded memory: a sequence that never drafts still flushes every `window` positions.
        if sum(int(f.shape[0]) for f in pending) >= self.window:
            self._flush([slot])

    def view(self, keys: Sequence[Hashable]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(context [B, window, context_kv_dim], valid [B, window])`` of tracked ``keys``,
        after projecting what they have pending (one projection for all of them). One key's
        context may be a view of the ring (``ContextRing.view_slots``): read it before the
        next :meth:`push` or :meth:`catch_up` of that key."""
        slots = [self._slots[k] for k in keys]
        self._flush(slots)
        return self.ring.view_slots(slots)

    def release(self, key: Hashable) -> None:
        """Forget ``key`` (finished or preempted: a preempted sequence re-reads its context)."""
        slot = self._slots.pop(key, None)
        if slot is not None:
            self._pending.pop(slot, None)
            self._free.append(slot)

    def _track(self, key: Hashable) -> int | None:
        slot = self._slots.get(key)
        if slot is None and self._free:
            slot = self._free.pop()
            self._slots[key] = slot
            self._reset(slot)
        return slot

    def _reset(self, slot: int) -> None:
        self.ring.reset(torch.tensor([slot]))
        self._counts[slot] = 0
        self._pending.pop(slot, None)

    def _flush(self, slots: list[int]) -> None:
        """Project the pending features of ``slots`` into ring entries: one projection, one
        append."""
        todo = [(slot, self._pending.pop(slot)) for slot in slots if self._pending.get(slot)]
        if not todo:
            return
        lengths = [sum(int(f.shape[0]) for f in chunks) for _, chunks in todo]
        parts = [f for _, chunks in todo for f in chunks]
        flat = parts[0] if len(parts) == 1 else torch.cat(parts)
        if flat.device != self.device:
            flat = flat.to(self.device)
        native = self.drafter.native
        if native is not None and not torch.is_grad_enabled():  # one compiled call
            entries = native.context_kv(flat)
        else:
            entries = self.drafter.context_kv(self.drafter.project_context(flat))
        if len(todo) == 1:  # one slot's rows in order: no index tensors
            self.ring.append_slot(todo[0][0], entries)
            return
        # Pad the entries (not the wider raw rows) to [B, T, D].
        ragged = entries.new_zeros(len(todo), max(lengths), entries.shape[-1])
        for i, part in enumerate(torch.split(entries, lengths)):
            ragged[i, : lengths[i]] = part
        self.ring.append(torch.tensor([slot for slot, _ in todo]), ragged, torch.tensor(lengths))
