"""The drafter's cached context keys/values (``context_kv``) and its product seam (``use_linear``)."""

from __future__ import annotations

import pytest
import torch
from conftest import make_drafter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from deepinfer_spec import DSparkDrafter, LinearFn, RecomputeTarget, propose


def _context(drafter: DSparkDrafter, batch: int, width: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randn(batch, width, drafter.feature_dim, generator=g)
    valid = torch.rand(batch, width, generator=g) < 0.8
    return drafter.project_context(raw).detach(), valid


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    layers=st.integers(1, 3),
    kv_heads=st.sampled_from([1, 2, 4]),
    width=st.integers(0, 8),
    batch=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_backbone_on_cached_keys_and_values_equals_the_projected_context(
    target: RecomputeTarget, layers: int, kv_heads: int, width: int, batch: int, seed: int
) -> None:
    """Several layers (each with its own slice of the entry), GQA ratios 4/2/1, an empty
    context and a full window: the cached form gives the same hidden states and drafts."""
    d = make_drafter(target, seed=seed, num_layers=layers, num_kv_heads=kv_heads)
    ctx, valid = _context(d, batch, width, seed)
    anchors = torch.randint(
        0, d.vocab_size, (batch,), generator=torch.Generator().manual_seed(seed)
    )
    with torch.no_grad():
        entries = d.context_kv(ctx)
        assert entries.shape == (batch, width, d.context_kv_dim)
        assert d.context_kv_dim == layers * 2 * kv_heads * (32 // 4)
        h = d.backbone(anchors, ctx, valid)
        h_kv = d.backbone(anchors, entries, valid, context_is_kv=True)
    torch.testing.assert_close(h_kv, h, atol=1e-5, rtol=1e-5)
    greedy = propose(d, anchors, ctx, valid, temperature=0)
    greedy_kv = propose(d, anchors, entries, valid, temperature=0, context_is_kv=True)
    assert torch.equal(greedy_kv.token_ids, greedy.token_ids)
    torch.testing.assert_close(greedy_kv.confidence, greedy.confidence, atol=1e-5, rtol=1e-5)


def test_context_kv_entry_layout_is_keys_then_values_per_layer(target: RecomputeTarget) -> None:
    d = make_drafter(target, num_layers=2, num_kv_heads=2)
    ctx, _ = _context(d, 1, 3, 0)
    with torch.no_grad():
        entries = d.context_kv(ctx)
        kv = d.layers[0].kv_dim
        for i, layer in enumerate(d.layers):
            base = 2 * kv * i
            assert torch.equal(entries[..., base : base + kv], layer.k_proj(ctx))
            assert torch.equal(entries[..., base + kv : base + 2 * kv], layer.v_proj(ctx))


def test_context_forms_are_checked_by_name(target: RecomputeTarget) -> None:
    """hidden_size == context_kv_dim here (32 == 1 layer x 2 x 2 heads x 8): the form is told,
    never guessed from the width."""
    d = make_drafter(target, num_kv_heads=2)
    assert d.context_kv_dim == d.hidden_size
    ctx, valid = _context(d, 2, 4, 1)
    anchors = torch.tensor([1, 2])
    with torch.no_grad():
        entries = d.context_kv(ctx)
        as_kv = d.backbone(anchors, entries, valid, context_is_kv=True)
        as_projected = d.backbone(anchors, ctx, valid)
    torch.testing.assert_close(as_kv, as_projected, atol=1e-5, rtol=1e-5)
    wide = make_drafter(target)  # 4 KV heads: entries are 64 wide
    with pytest.raises(ValueError, match=r"context: expected \[2, W, 64\] \(context_kv entries\)"):
        wide.backbone(anchors, ctx, valid, context_is_kv=True)
    with pytest.raises(ValueError, match="context: expected last dimension 32"):
        wide.context_kv(torch.zeros(2, 4, 64))


class CountingLinear:
    """A LinearFn that computes the product its own way (W @ x^T) and counts the layers."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.names: dict[int, str] = {}

    def __call__(self, x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
        name = self.names.get(id(layer), "?")
        self.calls[name] = self.calls.get(name, 0) + 1
        y = (layer.weight @ x.reshape(-1, x.shape[-1]).t()).t().reshape(*x.shape[:-1], -1)
        return y if layer.bias is None else y + layer.bias


@pytest.mark.parametrize("head", ["markov", "rnn"])
def test_use_linear_routes_every_own_product_and_changes_nothing_else(
    target: RecomputeTarget, head: str
) -> None:
    d = make_drafter(target, sequential_head=head)
    raw = torch.randn(1, 6, d.feature_dim, generator=torch.Generator().manual_seed(5))
    valid = torch.ones(1, 6, dtype=torch.bool)
    anchors = torch.tensor([7])
    with torch.no_grad():
        ctx = d.project_context(raw)
        reference = propose(d, anchors, d.context_kv(ctx), valid, temperature=0, context_is_kv=True)
        fn = CountingLinear()
        fn.names = {id(m): name for name, m in d.named_modules() if isinstance(m, nn.Linear)}
        assert isinstance(fn, LinearFn)
        d.use_linear(fn)
        assert d.linear is fn
        ctx_fn = d.project_context(raw)
        routed = propose(d, anchors, d.context_kv(ctx_fn), valid, temperature=0, context_is_kv=True)
    torch.testing.assert_close(ctx_fn, ctx, atol=1e-5, rtol=1e-5)
    assert torch.equal(routed.token_ids, reference.token_ids)
    torch.testing.assert_close(routed.confidence, reference.confidence, atol=1e-5, rtol=1e-5)
    gamma = d.config.gamma
    expected = {
        "context_proj": 1,
        "layers.0.k_proj": 2,  # the context's entries, then the block's keys
        "layers.0.v_proj": 2,
        "layers.0.q_proj": 1,
        "layers.0.o_proj": 1,
        "layers.0.gate_proj": 1,
        "layers.0.up_proj": 1,
        "layers.0.down_proj": 1,
        "markov_out": gamma,
        "confidence_head": 1,  # once for the whole block
    }
    if head == "rnn":
        expected["rnn"] = gamma - 1  # the first step has no previous code
    assert fn.calls == expected
    d.use_linear(None)
    assert d.linear is not fn
    with pytest.raises(TypeError, match="fn"):
        d.use_linear(3)  # type: ignore[arg-type]


def test_use_linear_keeps_training_differentiable(target: RecomputeTarget) -> None:
    d = make_drafter(target).train()
    d.use_linear(CountingLinear())
    valid = torch.ones(2, 4, dtype=torch.bool)
    h = d.backbone(torch.tensor([1, 2]), d.project_context(torch.randn(2, 4, d.feature_dim)), valid)
    h.square().mean().backward()
    grads = [p.grad for p in d.layers[0].parameters()] + [d.context_proj.weight.grad]
    assert all(g is not None and bool(g.abs().sum() > 0) for g in grads)
