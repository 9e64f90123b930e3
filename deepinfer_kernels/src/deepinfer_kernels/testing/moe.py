"""Hypothesis strategies for the MoE ops: router logits with deliberate ties, routing options
(DeepSeek-V3 grouped top-k included) and small expert weights.

Example::

    from hypothesis import given
    from deepinfer_kernels.testing.moe import route_cases

    @given(route_cases())
    def test_route(case):
        weights, ids = moe_route(case.logits, case.top_k, **case.options)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st


@dataclass(frozen=True)
class RouteCase:
    logits: torch.Tensor
    top_k: int
    options: dict[str, Any] = field(default_factory=dict)


@st.composite
def route_cases(draw: st.DrawFn, max_tokens: int = 6, max_experts: int = 16) -> RouteCase:
    """Logits drawn from a tiny set of values so that equal scores (ties) are common, or
    normal values; grouped routing when the expert count allows it."""
    num_experts = draw(st.sampled_from([e for e in (1, 2, 4, 6, 8, 12, 16) if e <= max_experts]))
    tokens = draw(st.integers(0, max_tokens))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    if draw(st.booleans()):
        palette = torch.tensor([-1.0, 0.0, 0.5, 2.0])
        logits = palette[torch.randint(0, 4, (tokens, num_experts), generator=gen)]
    else:
        logits = torch.randn(tokens, num_experts, generator=gen) * 3
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    logits = logits.to(dtype)
    divisors = [g for g in range(1, num_experts + 1) if num_experts % g == 0]
    n_group = draw(st.sampled_from(divisors))
    topk_group = draw(st.integers(1, n_group))
    top_k = draw(st.integers(1, topk_group * (num_experts // n_group)))
    options: dict[str, Any] = {
        "scoring": draw(st.sampled_from(["softmax", "sigmoid"])),
        "n_group": n_group,
        "topk_group": topk_group,
        "renormalize": draw(st.booleans()),
        "routed_scaling_factor": draw(st.sampled_from([1.0, 2.5])),
    }
    if draw(st.booleans()):
        # Bias values from a small set too: biased ties as well.
        options["correction_bias"] = torch.tensor([0.0, 0.25, -0.25])[
            torch.randint(0, 3, (num_experts,), generator=gen)
        ]
    return RouteCase(logits, top_k, options)


@dataclass(frozen=True)
class MoeCase:
    hidden: torch.Tensor
    w_gate_up: torch.Tensor
    w_down: torch.Tensor
    topk_weights: torch.Tensor
    topk_ids: torch.Tensor

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.hidden, self.w_gate_up, self.w_down, self.topk_weights, self.topk_ids


@st.composite
def moe_cases(
    draw: st.DrawFn,
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16),
    device: str = "cpu",
    max_tokens: int = 9,
) -> MoeCase:
    """Sizes that are not multiples of the kernel tiles, experts left without tokens, tokens
    sending several slots to the same expert, and skipped (-1) slots."""
    tokens = draw(st.integers(0, max_tokens))
    experts = draw(st.integers(1, 6))
    hidden = draw(st.sampled_from([8, 24, 40]))
    inter = draw(st.sampled_from([8, 16, 36]))
    top_k = draw(st.integers(1, 3))
    dtype = draw(st.sampled_from(dtypes))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    h = torch.randn(tokens, hidden, generator=gen)
    gu = torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5
    down = torch.randn(experts, hidden, inter, generator=gen) / inter**0.5
    ids = torch.randint(0, experts, (tokens, top_k), generator=gen)
    if draw(st.booleans()):
        ids = ids.masked_fill(torch.rand(tokens, top_k, generator=gen) < 0.2, -1)
    weights = torch.rand(tokens, top_k, generator=gen)
    return MoeCase(
        h.to(dtype).to(device),
        gu.to(dtype).to(device),
        down.to(dtype).to(device),
        weights.to(device),
        ids.to(torch.int32).to(device),
    )


def moe_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """``(atol, rtol)`` for ``fused_moe`` against the reference: fp32 is summation order only;
    half types round the activation, whose rounding may differ by one ulp between paths."""
    return {
        torch.float32: (1e-5, 1e-5),
        torch.float16: (4e-3, 4e-3),
        torch.bfloat16: (3e-2, 3e-2),
    }[dtype]
