"""The cached RoPE table of ``RotaryEmbedding.cos_sin`` against the direct computation."""

from __future__ import annotations

import pytest
import torch

from deepinfer.models.config import RopeScaling
from deepinfer.models.rope import RotaryEmbedding


def _direct(rope: RotaryEmbedding, positions: torch.Tensor, dtype: torch.dtype):
    """The formula computed afresh for ``positions`` (what ``cos_sin`` computed per call
    before the table)."""
    angles = positions.float().unsqueeze(-1) * rope.inv_freq
    cos, sin = angles.cos(), angles.sin()
    if rope.attention_factor != 1.0:
        cos, sin = cos * rope.attention_factor, sin * rope.attention_factor
    full_cos = torch.cat((cos, cos), dim=-1).to(dtype).unsqueeze(-2)
    signed_sin = torch.cat((-sin, sin), dim=-1).to(dtype).unsqueeze(-2)
    return full_cos, signed_sin


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim,theta", [(64, 100000.0), (80, 10000.0)])
def test_every_position_equals_direct_computation_as_the_table_grows(
    dtype: torch.dtype, head_dim: int, theta: float
) -> None:
    rope = RotaryEmbedding(head_dim, theta, max_position_embeddings=600)
    # One position at a time, as decode steps ask: the table grows 256 -> 512 -> 600 (the
    # maximum) -> past it on demand.
    for position in [0, 1, 255, 256, 300, 511, 512, 599, 600, 1000, 7]:
        got = rope.cos_sin(torch.tensor([position]), dtype)
        want = _direct(rope, torch.tensor([position]), dtype)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), position
    rows = rope._tables[(dtype, torch.device("cpu"))][0].shape[0]
    assert rows == 1001
    every = torch.arange(rows + 40)  # a chunk reaching past the table: grows it again
    got = rope.cos_sin(every, dtype)
    want = _direct(rope, every, dtype)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_yarn_attention_factor_and_2d_positions_match() -> None:
    scaling = RopeScaling(rope_type="yarn", factor=4.0, original_max_position_embeddings=256)
    rope = RotaryEmbedding(64, 10000.0, scaling, max_position_embeddings=1024)
    assert rope.attention_factor != 1.0
    positions = torch.tensor([[0, 5, 900], [3, 1023, 2]], dtype=torch.int32)
    got = rope.cos_sin(positions, torch.float32)
    want = _direct(rope, positions, torch.float32)
    assert got[0].shape == (2, 3, 1, 64)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_lookups_are_copies_and_bad_positions_raise() -> None:
    rope = RotaryEmbedding(64, 10000.0)
    cos, _ = rope.cos_sin(torch.tensor([3]), torch.float32)
    cos.zero_()  # a caller writing into its rows must not change the table
    again, _ = rope.cos_sin(torch.tensor([3]), torch.float32)
    assert torch.equal(again, _direct(rope, torch.tensor([3]), torch.float32)[0])
    assert rope.cos_sin(torch.tensor([], dtype=torch.int64), torch.float32)[0].shape == (0, 1, 64)
    with pytest.raises(ValueError, match="positions"):
        rope.cos_sin(torch.tensor([2, -1]), torch.float32)
    with pytest.raises(ValueError, match="positions"):
        rope.cos_sin(torch.arange(-1, 40), torch.float32)
    with pytest.raises(TypeError, match="positions"):
        rope.cos_sin(torch.tensor([1.0]), torch.float32)
