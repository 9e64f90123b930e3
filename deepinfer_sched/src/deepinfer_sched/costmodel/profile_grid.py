"""Which steps an offline profile times, and the rows it writes for them.

An engine's profiler (:func:`profile_engine`, over a ``SteppableEngine``) drives the engine; this grid says
which prefill lengths and decode batch shapes fit the engine's limits, and turns the seconds
it measured into the ``prefill`` / ``decode`` rows :func:`fit_profile` reads. Example::

    grid = ProfileGrid(prefill_lens=(16, 64), batch_sizes=(1, 4), context_lens=(64,))
    limits = EngineLimits(max_batched_tokens=2048, max_num_seqs=8, capacity_tokens=4096,
                          max_model_len=2048, block_size=16)
    rows = grid.run(limits, time_prefill=lambda n: ..., time_decode=lambda b, ctx: [...])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# Steps past the prompt each decode request runs: its first token comes from the prefill
# step, the next is a decode step whose batch may not yet be pure, then ``decode_steps``
# timed steps.
_DECODE_MARGIN = 2


def _positive_ints(name: str, values: Sequence[int]) -> tuple[int, ...]:
    out = tuple(values)
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in out):
        raise ValueError(f"{name}: expected ints >= 1, got {list(values)!r}")
    return out


@dataclass(frozen=True)
class EngineLimits:
    """What an engine can hold at once, in tokens and sequences."""

    max_batched_tokens: int
    max_num_seqs: int
    capacity_tokens: int  # KV blocks x block size
    max_model_len: int
    block_size: int

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            _positive_ints(name, [value])


@dataclass(frozen=True)
class ProfileGrid:
    """The step shapes an offline profile times: one prefill of each length in
    ``prefill_lens`` (``repeats`` times), and ``decode_steps`` pure decode steps of each
    ``batch_sizes`` x ``context_lens`` (tokens of prompt per sequence)."""

    prefill_lens: Sequence[int] = (16, 64, 128, 256, 512, 1024)
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16)
    context_lens: Sequence[int] = (64, 256, 1024)
    decode_steps: int = 4
    repeats: int = 3

    def __post_init__(self) -> None:
        for name in ("prefill_lens", "batch_sizes", "context_lens"):
            object.__setattr__(self, name, _positive_ints(name, getattr(self, name)))
        for name in ("decode_steps", "repeats"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")

    @property
    def decode_tokens(self) -> int:
        """Tokens each decode request generates: enough for ``decode_steps`` pure steps."""
        return self.decode_steps + _DECODE_MARGIN

    def prefill_lens_within(self, limits: EngineLimits) -> list[int]:
        """The prefill lengths one step of the engine can run (a prompt plus its first token
        in the KV, shorter than the model's length limit)."""
        return [
            n
            for n in self.prefill_lens
            if n <= limits.max_batched_tokens
            and n + 1 <= limits.capacity_tokens
            and n < limits.max_model_len
        ]

    def decode_shapes_within(self, limits: EngineLimits) -> list[tuple[int, int]]:
        """The ``(batch_size, context)`` pairs whose sequences all fit at once (each with
        a block of slack for where its tokens start in a block)."""
        shapes = []
        for b in self.batch_sizes:
            for ctx in self.context_lens:
                per_seq = ctx + self.decode_tokens
                if (
                    b <= limits.max_num_seqs
                    and b * (per_seq + limits.block_size) <= limits.capacity_tokens
                    and per_seq < limits.max_model_len
                ):
                    shapes.append((b, ctx))
        return shapes

    def run(
        self,
        limits: EngineLimits,
        time_prefill: Callable[[int], float],
        time_decode: Callable[[int, int], Sequence[float]],
    ) -> dict[str, list[dict[str, Any]]]:
        """The ``prefill`` and ``decode`` rows of a profile: ``time_prefill(n)`` (seconds of
        one ``n``-token prefill step, ``repeats`` times per length) and ``time_decode(b,
        ctx)`` (seconds of up to ``decode_steps`` pure decode steps; none: no row) over the
        shapes ``limits`` admit."""
        prefill = [
            prefill_row(n, [time_prefill(n) for _ in range(self.repeats)])
            for n in self.prefill_lens_within(limits)
        ]
        decode = []
        for b, ctx in self.decode_shapes_within(limits):
            seconds = list(time_decode(b, ctx))[: self.decode_steps]
            if seconds:
                decode.append(decode_row(b, ctx, seconds))
        return {"prefill": prefill, "decode": decode}


def prefill_row(new_tokens: int, seconds: Sequence[float]) -> dict[str, Any]:
    """A ``prefill`` row: ``new_tokens`` prompt tokens, none cached, timed ``seconds``."""
    return {"new_tokens": new_tokens, "cached_tokens": 0, "seconds": [round(s, 6) for s in seconds]}


def decode_row(batch_size: int, context: int, seconds: Sequence[float]) -> dict[str, Any]:
    """A ``decode`` row for pure steps of ``batch_size`` sequences of ``context`` prompt
    tokens: the context is the batch's total at the middle timed step (the prompt, the two
    tokens generated before timing starts, half the timed ones)."""
    total = batch_size * (context + _DECODE_MARGIN + len(seconds) // 2)
    return {
        "batch_size": batch_size,
        "context_tokens": total,
        "seconds": [round(s, 6) for s in seconds],
    }
