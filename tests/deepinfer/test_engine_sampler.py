"""``sample_next_tokens``: the all-greedy shortcut picks what ``sample`` picks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer.engine.outputs import RequestMetrics
from deepinfer.engine.sampler import sample_next_tokens
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.engine.sequence import Sequence
from deepinfer_kernels import sample


def _seqs(temperatures: list[float]) -> list[Sequence]:
    return [
        Sequence(i, f"r{i}", [1], SamplingParams(temperature=t), b"", RequestMetrics(0.0))
        for i, t in enumerate(temperatures)
    ]


@settings(max_examples=40)
@given(rows=st.integers(1, 16), vocab=st.integers(1, 50), seed=st.integers(0, 2**16))
def test_greedy_rows_take_the_first_maximum(rows: int, vocab: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    # Few distinct values, so rows have ties: the first maximal index must win.
    logits = torch.randint(-3, 3, (rows, vocab), generator=gen).float()
    got = sample_next_tokens(_seqs([0.0] * rows), logits, torch.Generator())
    want = sample(logits, torch.zeros(rows), torch.zeros(rows, dtype=torch.int64), torch.ones(rows))
    assert got == want.tolist()
    assert got == [int(row.tolist().index(max(row.tolist()))) for row in logits]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_bad_logits_still_raise(bad: float) -> None:
    logits = torch.zeros(2, 8)
    logits[1, 3] = bad
    with pytest.raises(ValueError, match="logits"):
        sample_next_tokens(_seqs([0.0, 0.0]), logits, torch.Generator())
    all_masked = torch.full((1, 8), float("-inf"))
    with pytest.raises(ValueError, match="logits"):
        sample_next_tokens(_seqs([0.0]), all_masked, torch.Generator())


def test_a_sampled_row_takes_the_full_path() -> None:
    logits = torch.tensor([[0.0, 5.0, 1.0], [0.0, 0.0, 50.0]])
    got = sample_next_tokens(_seqs([0.0, 1.0]), logits, torch.Generator().manual_seed(0))
    assert got == [1, 2]  # greedy row: argmax; sampled row: all mass on token 2
