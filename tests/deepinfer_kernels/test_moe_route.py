"""``moe_route`` against the reference: ties, grouped top-k, bias for selection only."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

import deepinfer_kernels as dk
from deepinfer_kernels.reference import moe_route_reference
from deepinfer_kernels.testing.moe import RouteCase, route_cases


@settings(max_examples=40, deadline=None)
@given(case=route_cases())
def test_route_matches_reference_including_ties(case: RouteCase) -> None:
    weights, ids = dk.moe_route(case.logits, case.top_k, **case.options)
    ref_w, ref_ids = moe_route_reference(case.logits, case.top_k, **case.options)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert ids.shape == (case.logits.shape[0], case.top_k)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_w, atol=1e-6, rtol=1e-6)
    # Each token's experts are distinct.
    for row in ids.tolist():
        assert len(set(row)) == len(row)


def test_ties_pick_lower_index_first() -> None:
    logits = torch.zeros(1, 8)
    _, ids = dk.moe_route(logits, 3)
    assert ids.tolist() == [[0, 1, 2]]
    logits = torch.tensor([[1.0, 3.0, 3.0, 1.0, 3.0, 0.0]])
    _, ids = dk.moe_route(logits, 4)
    assert ids.tolist() == [[1, 2, 4, 0]]


def test_group_ties_pick_lower_group_first() -> None:
    # Four groups of two; groups 1 and 3 tie for best, group 1 wins with topk_group=1.
    logits = torch.tensor([[0.0, 0.0, 2.0, 1.0, 0.0, 0.0, 2.0, 1.0]])
    _, ids = dk.moe_route(logits, 2, n_group=4, topk_group=1)
    assert ids.tolist() == [[2, 3]]


def test_correction_bias_selects_but_does_not_weigh() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    bias = torch.tensor([0.0, 0.0, 0.0, 5.0])
    weights, ids = dk.moe_route(logits, 1, scoring="sigmoid", correction_bias=bias)
    assert ids.tolist() == [[3]]
    torch.testing.assert_close(weights, torch.sigmoid(torch.tensor([[-1.0]])))


def test_deepseek_v3_group_score_is_sum_of_two_best() -> None:
    # Group 0 = (0.9, 0.1), group 1 = (0.6, 0.6) as biased scores: with a bias the sum of two
    # picks group 1; without a bias the best single expert picks group 0.
    scores = torch.tensor([[0.9, 0.1, 0.6, 0.6]])
    logits = torch.logit(scores)
    bias = torch.zeros(4)
    _, ids = dk.moe_route(logits, 1, scoring="sigmoid", n_group=2, topk_group=1,
                          correction_bias=bias)  # fmt: skip
    assert ids.tolist() == [[2]]
    _, ids = dk.moe_route(logits, 1, scoring="sigmoid", n_group=2, topk_group=1)
    assert ids.tolist() == [[0]]


def test_renormalize_and_scaling() -> None:
    logits = torch.randn(4, 16)
    weights, _ = dk.moe_route(logits, 4, renormalize=True, routed_scaling_factor=2.5)
    torch.testing.assert_close(weights.sum(-1), torch.full((4,), 2.5))


def test_empty_batch() -> None:
    weights, ids = dk.moe_route(torch.empty(0, 8), 2)
    assert weights.shape == ids.shape == (0, 2)


def test_torch_compile_uses_the_op() -> None:
    logits = torch.randn(3, 8)
    out = torch.compile(lambda x: dk.moe_route(x, 2, n_group=2, topk_group=1), fullgraph=True)(
        logits
    )
    ref = moe_route_reference(logits, 2, n_group=2, topk_group=1)
    assert torch.equal(out[1], ref[1])


def test_fake_gives_shapes() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        w, i = torch.ops.deepinfer.moe_route(torch.empty(5, 8), None, 3, True, 1, 1, 1.0, False)
    assert w.shape == i.shape == (5, 3) and i.dtype == torch.int32


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"router_logits": torch.zeros(4)}, "router_logits"),
        ({"router_logits": torch.zeros(2, 4, dtype=torch.int32)}, "router_logits"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": 9}, "top_k"),
        ({"top_k": 2.0}, "top_k"),
        ({"scoring": "relu"}, "scoring"),
        ({"n_group": 3}, "n_group"),
        ({"n_group": 2, "topk_group": 3}, "topk_group"),
        ({"n_group": 4, "topk_group": 1, "top_k": 3}, "top_k"),
        ({"routed_scaling_factor": 0.0}, "routed_scaling_factor"),
        ({"routed_scaling_factor": float("nan")}, "routed_scaling_factor"),
        ({"correction_bias": torch.zeros(7)}, "correction_bias"),
        ({"renormalize": 1}, "renormalize"),
        ({"router_logits": torch.tensor([[0.0, float("nan")] * 4])}, "router_logits"),
        ({"correction_bias": torch.tensor([float("inf")] + [0.0] * 7)}, "correction_bias"),
    ],
)
def test_bad_input_names_the_argument(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"router_logits": torch.zeros(2, 8), "top_k": 2}
    args.update(kwargs)
    logits, top_k = args.pop("router_logits"), args.pop("top_k")
    with pytest.raises((ValueError, TypeError), match=match):
        dk.moe_route(logits, top_k, **args)  # type: ignore[arg-type]
