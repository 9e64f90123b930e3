"""`profile_target`: the SPS curve of any `TargetAdapter`, timed on this machine.

DSpark's prefix scheduler and the draft gate weigh accepted tokens against what a verify step
of ``B`` tokens costs the target here. This times real verify-shaped steps through the
adapter's own ``extend``/``truncate`` (a scratch sequence with a ``context``-token history,
``B`` new tokens per step, cut back after each), so any serving stack whose target implements
the protocol gets its curve without writing a timing loop. Example::

    curve = profile_target(target, (1, 2, 4, 8), context=64)
    scheduler = PrefixScheduler(curve)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from deepinfer_spec.adapter import TargetAdapter
from deepinfer_spec.scheduling import SPSCurve, profile_sps

__all__ = ["profile_target"]


class _Scratch:
    """The id of the profile's own sequence: equal to no id a caller could hold."""

    def __repr__(self) -> str:
        return "<profile_target scratch sequence>"


@torch.no_grad()
def profile_target(
    target: TargetAdapter,
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32),
    *,
    context: int = 64,
    repeats: int = 2,
    warmup: int = 1,
    seed: int = 0,
    layer_ids: Sequence[int] = (),
    synchronize: Callable[[], None] | None = None,
) -> SPSCurve:
    """Time ``target`` extending a ``context``-token history by ``B`` random tokens, for each
    ``B`` in ``batch_sizes`` (``warmup`` untimed and ``repeats`` timed steps each; see
    :func:`profile_sps`). The history is written once; the KV of each timed step is cut
    again with ``truncate`` and the scratch sequence is released at the end, so the target holds
    no more memory afterwards than before. ``layer_ids``: the layers each step captures (a
    target that must return some features takes the drafter's). ``synchronize`` (e.g. ``torch.cuda.synchronize``)
    runs before each clock read. Cheap by design: ``len(batch_sizes) * (repeats + warmup)``
    forwards."""
    sizes = sorted({int(b) for b in batch_sizes})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"batch_sizes: expected positive sizes, got {list(batch_sizes)}")
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise ValueError(f"context: expected an int >= 1, got {context!r}")
    gen = torch.Generator().manual_seed(seed)
    seq = _Scratch()

    def extend(n: int) -> None:
        ids = torch.randint(0, target.vocab_size, (1, n), generator=gen)
        target.extend([seq], ids, torch.tensor([n]), layer_ids)

    try:
        extend(context)  # a real history for the timed steps to attend to

        def step(b: int) -> None:
            extend(b)
            target.truncate([seq], torch.tensor([context]))

        return profile_sps(step, sizes, repeats, warmup, synchronize=synchronize)
    finally:
        target.release([seq])
