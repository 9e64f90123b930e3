"""``fused_moe`` (torch path and Triton grouped GEMMs) against the per-token reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import deepinfer_kernels as dk
from deepinfer_kernels.moe import align_by_expert
from deepinfer_kernels.reference import fused_moe_reference
from deepinfer_kernels.testing.moe import MoeCase, moe_cases, moe_tolerance

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _check(case: MoeCase, use_triton: bool) -> None:
    out = dk.fused_moe(*case.tensors(), use_triton=use_triton)
    ref = fused_moe_reference(*case.tensors())
    assert out.dtype == case.hidden.dtype and out.shape == case.hidden.shape
    atol, rtol = moe_tolerance(case.hidden.dtype)
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)


@settings(max_examples=25, deadline=None)
@given(case=moe_cases(device=DEVICE))
def test_torch_path_matches_reference(case: MoeCase) -> None:
    _check(case, use_triton=False)


@settings(max_examples=8, deadline=None)
@given(case=moe_cases(device=DEVICE, max_tokens=5))
def test_triton_matches_reference(case: MoeCase) -> None:
    _check(case, use_triton=True)


@pytest.mark.parametrize("use_triton", [False, True])
def test_all_slots_skipped_gives_zeros(use_triton: bool) -> None:
    h = torch.randn(3, 8, device=DEVICE)
    gu, down = torch.randn(2, 16, 8, device=DEVICE), torch.randn(2, 8, 8, device=DEVICE)
    ids = torch.full((3, 2), -1, dtype=torch.int32, device=DEVICE)
    out = dk.fused_moe(h, gu, down, torch.ones(3, 2, device=DEVICE), ids, use_triton=use_triton)
    assert torch.equal(out, torch.zeros_like(h))


def test_matches_dense_mixture_when_every_expert_is_chosen() -> None:
    # With top_k = E the output is the weighted sum of every expert's dense SwiGLU MLP.
    torch.manual_seed(0)
    h, gu, down = torch.randn(4, 16), torch.randn(3, 24, 16) / 4, torch.randn(3, 16, 12) / 4
    w = torch.rand(4, 3)
    ids = torch.arange(3, dtype=torch.int32).expand(4, 3).contiguous()
    dense = sum(
        w[:, e, None]
        * (torch.nn.functional.silu(h @ gu[e, :12].T) * (h @ gu[e, 12:].T))
        @ down[e].T
        for e in range(3)
    )
    torch.testing.assert_close(dk.fused_moe(h, gu, down, w, ids), dense, atol=1e-5, rtol=1e-5)


@settings(max_examples=30, deadline=None)
@given(
    tokens=st.integers(0, 12),
    top_k=st.integers(1, 3),
    experts=st.integers(1, 5),
    block_m=st.sampled_from([1, 4, 16]),
    seed=st.integers(0, 1000),
)
def test_align_by_expert_layout(
    tokens: int, top_k: int, experts: int, block_m: int, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(-1, experts, (tokens, top_k), generator=gen, dtype=torch.int32)
    layout = align_by_expert(ids, experts, block_m)
    flat = ids.flatten().tolist()
    pairs = layout.sorted_pairs.tolist()
    assert len(pairs) % block_m == 0 and len(pairs) == layout.block_expert.numel() * block_m
    real = [p for p in pairs if p < len(flat)]
    # Every routed pair appears exactly once, skipped ones never.
    assert sorted(real) == [p for p, e in enumerate(flat) if e >= 0]
    for b, e in enumerate(layout.block_expert.tolist()):
        block = [p for p in pairs[b * block_m : (b + 1) * block_m] if p < len(flat)]
        assert all(flat[p] == e for p in block)
        assert block == sorted(block)  # pair order kept inside an expert
    blocks = layout.block_expert.tolist()
    used = [e for e in blocks if e < experts]
    assert used == sorted(used) and all(e == experts for e in blocks[len(used) :])


def test_torch_compile_uses_the_op() -> None:
    torch.manual_seed(1)
    h, gu, down = torch.randn(4, 8), torch.randn(3, 16, 8), torch.randn(3, 8, 8)
    w, ids = dk.moe_route(torch.randn(4, 3), 2)
    out = torch.compile(lambda *a: dk.fused_moe(*a, use_triton=False), fullgraph=True)(
        h, gu, down, w, ids
    )
    torch.testing.assert_close(out, fused_moe_reference(h, gu, down, w, ids), atol=1e-5, rtol=1e-5)


def test_fake_gives_shape() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        out = torch.ops.deepinfer.fused_moe(
            torch.empty(5, 8), torch.empty(3, 16, 8), torch.empty(3, 8, 8),
            torch.empty(5, 2), torch.empty(5, 2, dtype=torch.int32), False,
        )  # fmt: skip
    assert out.shape == (5, 8)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"hidden": torch.zeros(4, 8, 1)}, "hidden"),
        ({"hidden": torch.zeros(4, 8, dtype=torch.int64)}, "hidden"),
        ({"w_gate_up": torch.zeros(3, 15, 8)}, "w_gate_up"),
        ({"w_gate_up": torch.zeros(3, 16, 9)}, "w_gate_up"),
        ({"w_down": torch.zeros(3, 8, 7)}, "w_down"),
        ({"w_down": torch.zeros(3, 8, 8, dtype=torch.float16)}, "w_down"),
        ({"topk_ids": torch.zeros(3, 2, dtype=torch.int32)}, "topk_ids"),
        ({"topk_ids": torch.zeros(4, 2)}, "topk_ids"),
        ({"topk_weights": torch.zeros(4, 3)}, "topk_weights"),
        ({"topk_ids": torch.full((4, 2), 3, dtype=torch.int32)}, "topk_ids"),
        ({"topk_ids": torch.full((4, 2), -2, dtype=torch.int32)}, "topk_ids"),
    ],
)
def test_bad_input_names_the_argument(change: dict[str, torch.Tensor], match: str) -> None:
    args = {
        "hidden": torch.zeros(4, 8),
        "w_gate_up": torch.zeros(3, 16, 8),
        "w_down": torch.zeros(3, 8, 8),
        "topk_weights": torch.zeros(4, 2),
        "topk_ids": torch.zeros(4, 2, dtype=torch.int32),
    }
    args.update(change)
    with pytest.raises((ValueError, TypeError), match=match):
        dk.fused_moe(**args)
