"""The draft layer's grouped-query attention and the backbone's unmasked full window against a
plain reference (keys and values repeated per query head, an explicit mask): same hidden states
to fp32 rounding and the same greedy drafts."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from conftest import make_drafter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deepinfer_spec import DSparkDrafter, RecomputeTarget, propose
from deepinfer_spec.layers import DraftLayer, RopeTables, apply_rotary


def reference_layer(
    layer: DraftLayer,
    x: torch.Tensor,
    context: torch.Tensor,
    mask: torch.Tensor,
    rope: RopeTables,
) -> torch.Tensor:
    """The layer as written before grouped queries: K/V of ``[context ; block]``, repeated for
    every query head, and an explicit ``[B, 1, G, W + G]`` mask."""
    b, g, _ = x.shape
    h = layer.input_layernorm(x)
    kv_in = torch.cat((context, h), dim=1)
    q = layer.q_proj(h).view(b, g, layer.num_heads, layer.head_dim).transpose(1, 2)
    k = layer.k_proj(kv_in).view(b, -1, layer.num_kv_heads, layer.head_dim).transpose(1, 2)
    v = layer.v_proj(kv_in).view(b, -1, layer.num_kv_heads, layer.head_dim).transpose(1, 2)
    q, k = apply_rotary(q, rope.q_cos, rope.q_sin), apply_rotary(k, rope.k_cos, rope.k_sin)
    rep = layer.num_heads // layer.num_kv_heads
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.expand(b, 1, g, -1))
    x = x + layer.o_proj(att.transpose(1, 2).reshape(b, g, -1))
    h = layer.post_attention_layernorm(x)
    out: torch.Tensor = x + layer.down_proj(F.silu(layer.gate_proj(h)) * layer.up_proj(h))
    return out


def reference_backbone(
    d: DSparkDrafter, anchors: torch.Tensor, context: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    batch, width = valid.shape
    gamma = d.config.gamma
    x = torch.cat((d.target.embed(anchors)[:, None], d.mask_embed[None].expand(batch, -1, -1)), 1)
    keys_valid = torch.cat((valid, torch.ones(batch, gamma, dtype=torch.bool)), 1)
    cos, sin = d.rope_cos[-(width + gamma) :], d.rope_sin[-(width + gamma) :]
    rope = RopeTables(cos[width:], sin[width:], cos, sin)
    for layer in d.layers:
        x = reference_layer(layer, x, context, keys_valid[:, None, None, :], rope)
    return x


def greedy_from_hidden(d: DSparkDrafter, anchors: torch.Tensor, hidden: torch.Tensor) -> list:
    base = d.base_logits(hidden).float()
    prev, code, out = anchors, None, []
    for k in range(hidden.shape[1]):
        bias, code = d.sequential_step(prev, code)
        prev = d.draft_token_ids(torch.argmax(base[:, k] + bias.float(), dim=-1))
        out.append(prev)
    return torch.stack(out, 1).tolist()


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    kv_heads=st.sampled_from([1, 2, 4]),
    width=st.integers(0, 8),  # window = 8
    batch=st.integers(1, 3),
    full=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_backbone_equals_the_repeated_kv_reference(
    target: RecomputeTarget, kv_heads: int, width: int, batch: int, full: bool, seed: int
) -> None:
    """4 query heads over 1, 2 or 4 K/V heads; a full window (no mask) or a padded one; as
    projected context and as cached entries."""
    d = make_drafter(target, seed=seed, num_layers=2, num_kv_heads=kv_heads)
    g = torch.Generator().manual_seed(seed)
    ctx = d.project_context(torch.randn(batch, width, d.feature_dim, generator=g)).detach()
    valid = torch.ones(batch, width, dtype=torch.bool)
    if not full:
        valid = torch.rand(batch, width, generator=g) < 0.7
    anchors = torch.randint(0, d.vocab_size, (batch,), generator=g)
    with torch.no_grad():
        want = reference_backbone(d, anchors, ctx, valid)
        got = d.backbone(anchors, ctx, valid)
        got_kv = d.backbone(anchors, d.context_kv(ctx), valid, context_is_kv=True)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got_kv, want, atol=1e-5, rtol=1e-5)
        drafts = propose(d, anchors, ctx, valid, temperature=0).token_ids.tolist()
        assert drafts == greedy_from_hidden(d, anchors, want)


def test_layer_takes_a_per_query_mask_and_no_mask(target: RecomputeTarget) -> None:
    """A ``[B, 1, G, W + G]`` mask (different per query) is laid out for the grouped queries;
    ``None`` is every key valid."""
    d = make_drafter(target, num_kv_heads=2)
    layer = d.layers[0]
    g = torch.Generator().manual_seed(3)
    batch, width, gamma = 2, 5, d.config.gamma
    x = torch.randn(batch, gamma, d.hidden_size, generator=g)
    ctx = torch.randn(batch, width, d.hidden_size, generator=g)
    cos, sin = d.rope_cos[-(width + gamma) :], d.rope_sin[-(width + gamma) :]
    rope = RopeTables(cos[width:], sin[width:], cos, sin)
    mask = torch.rand(batch, 1, gamma, width + gamma, generator=g) < 0.6
    mask[..., width:] = True  # every query keeps at least the block
    with torch.no_grad():
        torch.testing.assert_close(
            layer(x, ctx, mask, rope), reference_layer(layer, x, ctx, mask, rope)
        )
        everything = torch.ones(batch, 1, 1, width + gamma, dtype=torch.bool)
        torch.testing.assert_close(
            layer(x, ctx, None, rope), reference_layer(layer, x, ctx, everything, rope)
        )
