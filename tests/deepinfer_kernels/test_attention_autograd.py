"""Backward of paged attention: the reference's gradient on every path (#23 item 7)."""

from __future__ import annotations

import pytest
import torch

import deepinfer_kernels as dk
from deepinfer_kernels.reference import paged_attention_reference, paged_decode_attention_reference
from deepinfer_kernels.testing import PagedLayout, materialize

LAYOUT = PagedLayout(
    q_lens=(1, 4, 3), seq_lens=(9, 6, 3), block_size=4, num_blocks=7,
    block_table=((5, 0, 2), (1, 4, 0), (6, 0, 0)), num_q_heads=4, num_kv_heads=2, head_dim=16,
)  # fmt: skip


def _leaves(case):  # type: ignore[no-untyped-def]
    return [t.detach().clone().requires_grad_() for t in (case.q, case.k_cache, case.v_cache)]


def _grads(fn, leaves, weight, lse_weight):  # type: ignore[no-untyped-def]
    out, lse = fn(*leaves)
    loss = (out.float() * weight).sum() + (lse * lse_weight).sum()
    return torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("use_triton", [False, True])
@pytest.mark.parametrize("causal", [True, False])
def test_paged_attention_gradients_match_the_reference(use_triton: bool, causal: bool) -> None:
    case = materialize(LAYOUT, dtype=torch.float32, device="cpu", seed=3, soft_cap=4.0)
    opts = {**case.options(), "causal": causal}
    meta = case.tensors()[3:]
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(case.q.shape, generator=gen)
    lse_weight = torch.randn(case.q.shape[:2], generator=gen)

    def ours(q, k, v):  # type: ignore[no-untyped-def]
        return dk.paged_attention(q, k, v, *meta, **opts, return_lse=True, use_triton=use_triton)

    def ref(q, k, v):  # type: ignore[no-untyped-def]
        return paged_attention_reference(q, k, v, *meta, **opts, return_lse=True)

    got = _grads(ours, _leaves(case), weight, lse_weight)
    want = _grads(ref, _leaves(case), weight, lse_weight)
    for g, w in zip(got, want):
        assert bool(w.abs().sum() > 0)  # the loss reaches every input
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("use_triton", [False, True])
def test_decode_gradients_match_the_reference(use_triton: bool) -> None:
    layout = PagedLayout(
        q_lens=(1, 1), seq_lens=(9, 5), block_size=4, num_blocks=6,
        block_table=((5, 0, 2), (1, 4, 0)), num_q_heads=4, num_kv_heads=1, head_dim=8,
    )  # fmt: skip
    case = materialize(layout, dtype=torch.float32, device="cpu", seed=4)
    bt, lens = case.tensors()[3:5]
    weight = torch.randn(case.q.shape, generator=torch.Generator().manual_seed(1))
    zero_lse = torch.zeros(case.q.shape[:2])

    def ours(q, k, v):  # type: ignore[no-untyped-def]
        return dk.paged_decode_attention(
            q, k, v, bt, lens, num_splits=2, return_lse=True, use_triton=use_triton
        )

    def ref(q, k, v):  # type: ignore[no-untyped-def]
        return paged_decode_attention_reference(q, k, v, bt, lens, return_lse=True)

    got = _grads(ours, _leaves(case), weight, zero_lse)
    want = _grads(ref, _leaves(case), weight, zero_lse)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


def test_no_grad_wanted_leaves_outputs_plain() -> None:
    case = materialize(LAYOUT, dtype=torch.float32, device="cpu", seed=5)
    q = case.q.clone().requires_grad_()
    with torch.no_grad():
        out = dk.paged_attention(q, *case.tensors()[1:])
    assert out.grad_fn is None and not out.requires_grad


def test_compiled_op_backward_matches_eager() -> None:
    case = materialize(LAYOUT, dtype=torch.float32, device="cpu", seed=6)
    meta = case.tensors()[3:]

    def loss(q, k, v):  # type: ignore[no-untyped-def]
        return dk.paged_attention(q, k, v, *meta, **case.options(), check_values=False).sum()

    eager = torch.autograd.grad(loss(*(leaves := _leaves(case))), leaves)
    compiled_fn = torch.compile(loss, backend="aot_eager", fullgraph=True)
    compiled = torch.autograd.grad(compiled_fn(*(leaves := _leaves(case))), leaves)
    for g, w in zip(compiled, eager):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)
