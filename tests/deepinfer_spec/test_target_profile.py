"""`deepinfer_spec.profile_target`: an SPS curve from any `TargetAdapter`'s extend/truncate,
leaving the target as it found it; bad arguments named."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import pytest
import torch

from deepinfer_spec import RecomputeTarget, SPSCurve, TargetOutput, profile_target
from deepinfer_spec.testing import TinyTarget


class CountingTarget(RecomputeTarget):
    """Records each call's sequence ids and lengths."""

    def __init__(self) -> None:
        super().__init__(TinyTarget(vocab_size=32, hidden_size=16, num_layers=1, seed=0))  # type: ignore[arg-type]
        self.calls: list[tuple[str, list[int]]] = []

    def extend(
        self,
        seq_ids: Sequence[Hashable],
        input_ids: torch.Tensor,
        input_lens: torch.Tensor,
        layer_ids: Sequence[int],
    ) -> TargetOutput:
        assert int(input_ids.max()) < self.vocab_size
        self.calls.append(("extend", input_lens.tolist()))
        return super().extend(seq_ids, input_ids, input_lens, layer_ids)

    def truncate(self, seq_ids: Sequence[Hashable], lengths: torch.Tensor) -> None:
        self.calls.append(("truncate", lengths.tolist()))
        super().truncate(seq_ids, lengths)


def test_curve_from_extend_steps_over_a_history_released_after() -> None:
    target = CountingTarget()
    synced: list[int] = []
    curve = profile_target(
        target,
        (4, 1, 2),
        context=6,
        repeats=2,
        warmup=1,
        layer_ids=(0,),
        synchronize=lambda: synced.append(1),
    )
    assert isinstance(curve, SPSCurve) and curve.batch_sizes == (1, 2, 4)
    assert all(s > 0 for s in curve.steps_per_second)
    # The history once, then per size 1 warm-up + 2 timed steps, each cut back to the history.
    assert target.calls[0] == ("extend", [6])
    steps = target.calls[1:]
    assert [c for c in steps if c[0] == "extend"] == [
        ("extend", [b]) for b in (1, 2, 4) for _ in range(3)
    ]
    assert all(c == ("truncate", [6]) for c in steps[1::2])
    assert synced  # the device is synchronised before clock reads
    assert target._tokens == {}  # the scratch sequence is gone


def test_the_target_is_released_when_a_step_fails() -> None:
    target = CountingTarget()

    def broken(*args: object) -> None:
        raise RuntimeError("out of KV")

    target.truncate = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="out of KV"):
        profile_target(target, (1,), context=4, layer_ids=(0,))
    assert target._tokens == {}


@pytest.mark.parametrize(
    ("sizes", "context", "name"),
    [
        ((), 4, "batch_sizes"),
        ((0, 2), 4, "batch_sizes"),
        ((1,), 0, "context"),
        ((1,), 2.5, "context"),
    ],
)
def test_bad_arguments_are_named(sizes: tuple[int, ...], context: object, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        profile_target(CountingTarget(), sizes, context=context)  # type: ignore[arg-type]
