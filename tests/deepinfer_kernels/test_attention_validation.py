"""Invalid input raises ValueError (or TypeError for non-tensors) naming the argument."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import deepinfer_kernels as dk
from deepinfer_kernels.testing import PagedLayout, materialize

LAYOUT = PagedLayout(
    q_lens=(1, 3), seq_lens=(5, 7), block_size=4, num_blocks=6,
    block_table=((2, 5), (0, 4)), num_q_heads=4, num_kv_heads=2, head_dim=16,
)  # fmt: skip


def _args() -> dict[str, Any]:
    case = materialize(LAYOUT, seed=0)
    return dict(
        zip(
            ["q", "k_cache", "v_cache", "block_table", "seq_lens", "cu_seqlens_q"],
            case.tensors(),
            strict=True,
        )
    )


def _i32(values: Any) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


BAD_INPUTS: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("q 2-D", lambda a: a.update(q=a["q"][:, 0]), "q"),
    ("q int dtype", lambda a: a.update(q=a["q"].int()), "q"),
    ("q head_dim", lambda a: a.update(q=a["q"][..., :8]), "head_dim"),
    ("Hq not multiple", lambda a: a.update(q=a["q"][:, :3]), "q"),
    ("k_cache 3-D", lambda a: a.update(k_cache=a["k_cache"][0]), "k_cache"),
    ("v_cache shape", lambda a: a.update(v_cache=a["v_cache"][:5]), "v_cache"),
    ("k_cache dtype", lambda a: a.update(k_cache=a["k_cache"].half()), "k_cache"),
    (
        "block size 3",
        lambda a: a.update(k_cache=a["k_cache"][:, :3], v_cache=a["v_cache"][:, :3]),
        "block_size",
    ),
    ("block_table int64", lambda a: a.update(block_table=a["block_table"].long()), "block_table"),
    ("block_table 1-D", lambda a: a.update(block_table=a["block_table"][0]), "block_table"),
    ("seq_lens shape", lambda a: a.update(seq_lens=_i32([5, 7, 1])), "seq_lens"),
    ("cu_seqlens_q shape", lambda a: a.update(cu_seqlens_q=_i32([0, 4])), "cu_seqlens_q"),
    ("negative seq_len", lambda a: a.update(seq_lens=_i32([-1, 7])), "seq_lens"),
    ("beyond capacity", lambda a: a.update(seq_lens=_i32([9, 7])), "seq_lens"),
    ("q_len > seq_len", lambda a: a.update(seq_lens=_i32([5, 2])), "cu_seqlens_q"),
    ("decreasing cu", lambda a: a.update(cu_seqlens_q=_i32([0, 3, 1])), "cu_seqlens_q"),
    ("cu end", lambda a: a.update(cu_seqlens_q=_i32([0, 1, 3])), "cu_seqlens_q"),
    ("block id out of pool", lambda a: a.update(block_table=_i32([[2, 9], [0, 4]])), "block_table"),
    (
        "negative block id in use",
        lambda a: a.update(block_table=_i32([[2, -1], [0, 4]])),
        "block_table",
    ),
]


@pytest.mark.parametrize(("label", "mutate", "name"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_paged_attention_rejects(
    label: str, mutate: Callable[[dict[str, Any]], None], name: str
) -> None:
    args = _args()
    mutate(args)
    with pytest.raises(ValueError, match=name):
        dk.paged_attention(**args)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("scale", -1.0),
        ("scale", float("nan")),
        ("sliding_window", 0),
        ("sliding_window", 2.5),
        ("soft_cap", 0.0),
    ],
)
def test_paged_attention_rejects_options(option: str, value: Any) -> None:
    with pytest.raises(ValueError, match=option):
        dk.paged_attention(**_args(), **{option: value})


def test_unused_table_entries_may_hold_anything() -> None:
    args = _args()
    expected = dk.paged_attention(**args)
    # Entries beyond each sequence's blocks are never read: garbage there changes nothing.
    args["block_table"] = _i32([[2, 5, -7], [0, 4, 10**6]])
    torch.testing.assert_close(dk.paged_attention(**args), expected, rtol=0, atol=0)


def test_non_tensor_is_type_error() -> None:
    args = _args()
    args["seq_lens"] = [5, 7]
    with pytest.raises(TypeError, match="seq_lens"):
        dk.paged_attention(**args)


def test_decode_rejects() -> None:
    a = _args()
    with pytest.raises(ValueError, match="q"):  # 4 query rows for 2 sequences
        dk.paged_decode_attention(
            a["q"], a["k_cache"], a["v_cache"], a["block_table"], a["seq_lens"]
        )
    q = a["q"][:2]
    with pytest.raises(ValueError, match="num_splits"):
        dk.paged_decode_attention(
            q, a["k_cache"], a["v_cache"], a["block_table"], a["seq_lens"], num_splits=0
        )
    with pytest.raises(ValueError, match="seq_lens"):
        dk.paged_decode_attention(q, a["k_cache"], a["v_cache"], a["block_table"], _i32([0, -2]))


def test_merge_rejects() -> None:
    o, lse = torch.randn(3, 2, 8), torch.randn(3, 2)
    with pytest.raises(ValueError, match="o_b"):
        dk.merge_attention_states(o, lse, o[:2], lse)
    with pytest.raises(ValueError, match="lse_b"):
        dk.merge_attention_states(o, lse, o, lse[:, :1])
    with pytest.raises(ValueError, match="lse_a"):
        dk.merge_attention_states(o, lse.double(), o, lse)
    with pytest.raises(ValueError, match="o_a"):
        dk.merge_attention_states(o[0], lse, o[0], lse)
