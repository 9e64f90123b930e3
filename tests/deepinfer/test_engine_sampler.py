"""``sample_next_tokens``: the all-greedy shortcut picks what ``sample`` picks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer.engine.outputs import RequestMetrics
from deepinfer.engine.sampler import greedy_tokens, sample_next_tokens
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


@settings(max_examples=60)
@given(
    rows=st.integers(1, 8),
    vocab=st.integers(1, 40),
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]),
)
def test_greedy_tokens_take_torch_max_first_maximum(
    rows: int, vocab: int, seed: int, dtype: torch.dtype
) -> None:
    """Ties to the lower id, for the CPU float32 numpy path and the torch path alike."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randint(-3, 3, (rows, vocab), generator=gen).to(dtype)
    if seed % 3 == 0 and vocab > 1:
        logits[0, seed % vocab] = float("-inf")  # a masked entry is fine while one is finite
    assert greedy_tokens(logits) == logits.float().max(dim=-1).indices.tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_greedy_tokens_refuse_rows_without_a_finite_maximum(bad: float, dtype: torch.dtype) -> None:
    logits = torch.zeros(3, 8, dtype=dtype)
    logits[2, 5] = bad
    assert greedy_tokens(logits) is None
    assert greedy_tokens(torch.full((1, 4), float("-inf"), dtype=dtype)) is None
    assert greedy_tokens(logits[:2]) == [0, 0]


def test_greedy_tokens_of_a_non_contiguous_view() -> None:
    logits = torch.tensor([[0.0, 1.0, 9.0, 3.0], [5.0, 2.0, 1.0, 7.0]])
    assert greedy_tokens(logits[:, ::2]) == [1, 0]
    assert greedy_tokens(logits.t().contiguous().t()) == [2, 3]
