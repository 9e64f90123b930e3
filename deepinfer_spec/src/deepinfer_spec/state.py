"""Per-request drafter state: a ring buffer of the most recent context features.

The drafter attends to the last ``window`` target positions only, so a request's whole state is
those ``window`` feature vectors plus a position counter. The buffer keeps ``slack`` extra
slots so that features of not-yet-verified tokens can be appended eagerly and rolled back: a
rollback of up to ``slack`` positions never needs a slot that an append overwrote (the window
after a rollback to count ``n'`` needs positions ``>= n' - window >= n - slack - window``, and the
last ``window + slack`` positions are always intact).
"""

from __future__ import annotations

import torch


class ContextRing:
    """Batched ring buffers, one slot per live request.

    Args:
        max_requests: number of slots.
        window: positions a view returns (the drafter's attention window).
        feature_dim: size of each stored feature vector.
        slack: deepest supported rollback (``gamma + 1`` covers a whole verify block).
    """

    def __init__(
        self,
        max_requests: int,
        window: int,
        feature_dim: int,
        *,
        slack: int = 0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        for name, value, low in (
            ("max_requests", max_requests, 1),
            ("window", window, 1),
            ("feature_dim", feature_dim, 1),
            ("slack", slack, 0),
        ):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name}: expected an int >= {low}, got {value!r}")
        self.window = window
        self.slack = slack
        self.capacity = window + slack
        # On the CPU every position is written twice, at ring index i and i + capacity: the
        # last `window` positions are then one run of the buffer whatever the wrap, so a
        # one-slot view is a slice of it, not a copy (see view_slots).
        mirrored = torch.device(device).type == "cpu"
        self._buf = torch.zeros(
            max_requests,
            self.capacity * (2 if mirrored else 1),
            feature_dim,
            dtype=dtype,
            device=device,
        )
        self._count = torch.zeros(max_requests, dtype=torch.int64, device=device)
        # On the CPU the counts live as Python ints (the tensor stays at zero): every append and
        # view reads them, and a tensor read is an op's dispatch each time.
        self._host: list[int] | None = (
            [0] * max_requests if self._buf.device.type == "cpu" else None
        )
        # Per slot on the CPU: the highest count since its reset (rollbacks go back from it).
        self._high = [0] * max_requests

    @property
    def max_requests(self) -> int:
        return int(self._buf.shape[0])

    @property
    def feature_dim(self) -> int:
        return int(self._buf.shape[2])

    def counts(self, slots: torch.Tensor) -> torch.Tensor:
        """Positions appended so far (= the absolute position of each slot's next token)."""
        slots = self._check_slots(slots)
        if self._host is not None:
            return torch.tensor([self._host[s] for s in slots.tolist()], dtype=torch.int64)
        return self._count[slots].clone()

    def reset(self, slots: torch.Tensor) -> None:
        slots = self._check_slots(slots)
        if self._host is not None:
            for s in slots.tolist():
                self._host[s] = self._high[s] = 0
        self._count[slots] = 0
        self._buf[slots] = 0

    def append(self, slots: torch.Tensor, features: torch.Tensor, lengths: torch.Tensor) -> None:
        """Append ``features[b, :lengths[b]]`` to slot ``slots[b]`` (ragged; ``[B, T, D]``)."""
        slots = self._check_slots(slots)
        batch = int(slots.shape[0])
        if (
            features.ndim != 3
            or features.shape[0] != batch
            or features.shape[2] != self.feature_dim
        ):
            raise ValueError(
                f"features: expected [{batch}, T, {self.feature_dim}], got {tuple(features.shape)}"
            )
        lengths = self._check_lengths(lengths, batch, int(features.shape[1]))
        if self._host is not None:
            self._append_slices(slots.tolist(), features, lengths.tolist())
            return
        t = torch.arange(features.shape[1], device=self._buf.device)[None, :]
        # Only the last `capacity` tokens of a long append can survive in the ring.
        keep = (t < lengths[:, None]) & (t >= lengths[:, None] - self.capacity)
        pos = self._count[slots][:, None] + t
        ring = torch.remainder(pos, self.capacity)
        rows = slots[:, None].expand_as(ring)
        self._buf[rows[keep], ring[keep]] = features[keep].to(self._buf.dtype)
        self._count[slots] += lengths

    def rollback(self, slots: torch.Tensor, num_tokens: torch.Tensor) -> None:
        """Forget the last ``num_tokens[b]`` positions of each slot (at most ``slack``)."""
        slots = self._check_slots(slots)
        num_tokens = self._check_lengths(num_tokens, int(slots.shape[0]), self.slack)
        if self._host is not None:
            back = list(zip(slots.tolist(), num_tokens.tolist()))
            if any(n > self._host[s] for s, n in back):
                raise ValueError("num_tokens: cannot roll back past the start of a sequence")
            for s, n in back:
                self._host[s] -= n
            return
        if bool((num_tokens > self._count[slots]).any()):
            raise ValueError("num_tokens: cannot roll back past the start of a sequence")
        self._count[slots] -= num_tokens

    def view(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The last ``window`` features of each slot in time order, oldest first.

        Returns ``(features [B, window, D], valid [B, window] bool)``; a slot with fewer than
        ``window`` positions is left-padded with zeros marked invalid. Position ``j`` of the view
        is ``j - window`` positions before the slot's next token.
        """
        slots = self._check_slots(slots)
        if self._host is not None:
            return self._view_slices(slots.tolist())
        j = torch.arange(self.window, device=self._buf.device)[None, :]
        pos = self._count[slots][:, None] - self.window + j
        valid = pos >= 0
        ring = torch.remainder(pos, self.capacity)
        feats = self._buf[slots[:, None].expand_as(ring), ring]
        feats = torch.where(valid[..., None], feats, torch.zeros((), dtype=feats.dtype))
        return feats, valid

    # On the CPU a slot's positions are at most two contiguous runs of its ring, so appends and
    # views copy slices instead of building index tensors: a decode step's append and view
    # (one row, one to six positions, a 128-position view) were ~1 ms of index arithmetic,
    # about 0.04 of a plain SmolLM2 step. Same values as the indexed path (which devices with
    # their own memory keep: reading the counts here would synchronise them).

    def _runs(self, first: int, count: int) -> list[tuple[int, int, int]]:
        """``(ring start, ring end, offset)`` runs holding ring positions ``first ..
        first + count - 1`` (``count <= capacity``), ``offset`` counted from ``first``."""
        start = first % self.capacity
        head = min(count, self.capacity - start)
        runs = [(start, start + head, 0)]
        if head < count:
            runs.append((0, count - head, head))
        return runs

    def append_slot(self, slot: int, features: torch.Tensor) -> None:
        """Append ``features [T, D]`` to ``slot``: :meth:`append` of one slot, without its
        index tensors where the ring is on the CPU (a decode step's one-slot append)."""
        if self._host is None:
            self.append(torch.tensor([slot]), features[None], torch.tensor([features.shape[0]]))
            return
        self._check_slot(slot)
        if features.ndim != 2 or features.shape[1] != self.feature_dim:
            raise ValueError(
                f"features: expected [T, {self.feature_dim}], got {tuple(features.shape)}"
            )
        self._append_slices([slot], features[None], [int(features.shape[0])])

    def view_slots(self, slots: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`view` of ``slots`` given as ints (no index tensor where the ring is on the
        CPU); they must be distinct. On the CPU the features of one slot are a view of the
        ring itself (no copy), valid until that slot's next append or reset."""
        if self._host is None:
            return self.view(torch.tensor(slots, device=self._buf.device))
        for slot in slots:
            self._check_slot(slot)
        if len(set(slots)) != len(slots):
            raise ValueError("slots: duplicate slots in one call")
        count = self._host[slots[0]] if len(slots) == 1 else 0
        # Positions count - window .. count - 1 lie at one run of the mirrored buffer; those
        # before position 0 (a short sequence) at indices no append reached since the reset,
        # which hold zeros, unless rollbacks went back more than `slack` from the highest
        # count (then those indices hold rolled-back rows: copy, as for several slots).
        if len(slots) != 1 or (
            count < self.window and self._high[slots[0]] - count > self.capacity - self.window
        ):
            return self._view_slices(slots)
        slot = slots[0]
        start = (count - self.window) % self.capacity
        feats = self._buf[slot : slot + 1, start : start + self.window]
        valid = torch.ones(1, self.window, dtype=torch.bool)
        if count < self.window:
            valid[0, : self.window - count] = False
        return feats, valid

    def _check_slot(self, slot: int) -> None:
        if not isinstance(slot, int) or isinstance(slot, bool) or not 0 <= slot < self.max_requests:
            raise ValueError(f"slot: expected an int in [0, {self.max_requests}), got {slot!r}")

    def _append_slices(self, slots: list[int], features: torch.Tensor, lengths: list[int]) -> None:
        assert self._host is not None
        for b, (slot, length) in enumerate(zip(slots, lengths)):
            count = self._host[slot]
            keep = min(length, self.capacity)  # only the last `capacity` can survive
            skip = length - keep
            rows = features[b, skip:length]
            cap = self.capacity
            for lo, hi, off in self._runs(count + skip, keep):
                self._buf[slot, lo:hi] = rows[off : off + hi - lo]
                self._buf[slot, lo + cap : hi + cap] = rows[off : off + hi - lo]
            self._host[slot] = count + length
            self._high[slot] = max(self._high[slot], count + length)

    def _view_slices(self, slots: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        assert self._host is not None
        counts = [self._host[s] for s in slots]
        full = all(c >= self.window for c in counts)
        batch = len(slots)
        # A full window is written whole: no zero fill under it.
        feats = (self._buf.new_empty if full else self._buf.new_zeros)(
            batch, self.window, self.feature_dim
        )
        valid = torch.ones(batch, self.window, dtype=torch.bool)
        for b, (slot, count) in enumerate(zip(slots, counts)):
            have = min(count, self.window)
            pad = self.window - have
            if pad:
                valid[b, :pad] = False
            for lo, hi, off in self._runs(count - have, have) if have else []:
                feats[b, pad + off : pad + off + hi - lo] = self._buf[slot, lo:hi]
        return feats, valid

    def _check_slots(self, slots: torch.Tensor) -> torch.Tensor:
        if not isinstance(slots, torch.Tensor) or slots.ndim != 1 or slots.dtype.is_floating_point:
            raise TypeError(f"slots: expected a 1-D integer tensor, got {slots!r}")
        slots = slots.to(device=self._buf.device, dtype=torch.int64)
        if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= self.max_requests):
            raise ValueError(f"slots: expected values in [0, {self.max_requests}), got {slots}")
        # One slot (a batch-1 step) cannot repeat: skip the sort (~0.1 ms a call on a CPU).
        if slots.numel() > 1 and torch.unique(slots).numel() != slots.numel():
            raise ValueError("slots: duplicate slots in one call")
        return slots

    def _check_lengths(self, lengths: torch.Tensor, batch: int, high: int) -> torch.Tensor:
        if not isinstance(lengths, torch.Tensor) or tuple(lengths.shape) != (batch,):
            raise ValueError(f"lengths: expected an int tensor of shape [{batch}]")
        lengths = lengths.to(device=self._buf.device, dtype=torch.int64)
        if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > high):
            raise ValueError(f"lengths: expected values in [0, {high}], got {lengths.tolist()}")
        return lengths
