"""Input checks for the MoE ops; every error names the argument at fault.

Shape, dtype and device checks always run. Value checks (finite router logits, expert ids in
range) read the tensors, which costs a host sync on CUDA; they run unless the caller passes
``check_values=False`` and are skipped while ``torch.compile`` traces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SCORINGS = ("softmax", "sigmoid")


def want_value_checks(check_values: bool) -> bool:
    return check_values and not torch.compiler.is_compiling()


def _tensor(t: object, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t)!r}")
    return t


def _int(value: object, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name}: expected {lo} <= {name} <= {hi}, got {value}")
    return value


@dataclass(frozen=True)
class RouteOptions:
    """Resolved routing options (``topk_group`` filled in, scale a float)."""

    top_k: int
    scoring: str
    n_group: int
    topk_group: int
    routed_scaling_factor: float
    renormalize: bool


def check_route(
    router_logits: object,
    top_k: object,
    scoring: object,
    n_group: object,
    topk_group: object,
    routed_scaling_factor: object,
    correction_bias: object,
    renormalize: object,
) -> RouteOptions:
    logits = _tensor(router_logits, "router_logits")
    if logits.dim() != 2:
        raise ValueError(
            f"router_logits: expected [num_tokens, num_experts], got shape {tuple(logits.shape)}"
        )
    if logits.dtype not in FLOAT_DTYPES:
        raise ValueError(
            f"router_logits: expected float32, float16 or bfloat16, got {logits.dtype}"
        )
    num_experts = logits.shape[1]
    if num_experts < 1:
        raise ValueError("router_logits: expected at least one expert (column)")
    if scoring not in SCORINGS:
        raise ValueError(f"scoring: expected 'softmax' or 'sigmoid', got {scoring!r}")
    groups = _int(n_group, "n_group", 1, num_experts)
    if num_experts % groups:
        raise ValueError(f"n_group: {groups} does not divide the {num_experts} experts")
    keep = groups if topk_group is None else _int(topk_group, "topk_group", 1, groups)
    eligible = keep * (num_experts // groups)
    k = _int(top_k, "top_k", 1, eligible)
    if (
        isinstance(routed_scaling_factor, bool)
        or not isinstance(routed_scaling_factor, (int, float))
        or not math.isfinite(routed_scaling_factor)
        or routed_scaling_factor <= 0
    ):
        raise ValueError(
            f"routed_scaling_factor: expected a finite float > 0, got {routed_scaling_factor!r}"
        )
    if not isinstance(renormalize, bool):
        raise TypeError(f"renormalize: expected a bool, got {type(renormalize)!r}")
    if correction_bias is not None:
        bias = _tensor(correction_bias, "correction_bias")
        if tuple(bias.shape) != (num_experts,):
            raise ValueError(
                f"correction_bias: expected shape ({num_experts},), got {tuple(bias.shape)}"
            )
        if bias.dtype not in FLOAT_DTYPES:
            raise ValueError(f"correction_bias: expected a float dtype, got {bias.dtype}")
        if bias.device != logits.device:
            raise ValueError(
                f"correction_bias: expected device {logits.device} (as router_logits), "
                f"got {bias.device}"
            )
    return RouteOptions(k, str(scoring), groups, keep, float(routed_scaling_factor), renormalize)


def check_route_values(router_logits: torch.Tensor, correction_bias: torch.Tensor | None) -> None:
    if not bool(torch.isfinite(router_logits).all()):
        raise ValueError("router_logits: expected finite values (found NaN or infinity)")
    if correction_bias is not None and not bool(torch.isfinite(correction_bias).all()):
        raise ValueError("correction_bias: expected finite values (found NaN or infinity)")


def check_fused_moe(
    hidden: object,
    w_gate_up: object,
    w_down: object,
    topk_weights: object,
    topk_ids: object,
) -> None:
    h = _tensor(hidden, "hidden")
    gu = _tensor(w_gate_up, "w_gate_up")
    down = _tensor(w_down, "w_down")
    tw = _tensor(topk_weights, "topk_weights")
    ti = _tensor(topk_ids, "topk_ids")
    if h.dim() != 2:
        raise ValueError(f"hidden: expected [num_tokens, hidden_size], got shape {tuple(h.shape)}")
    if h.dtype not in FLOAT_DTYPES:
        raise ValueError(f"hidden: expected float32, float16 or bfloat16, got {h.dtype}")
    tokens, hidden_size = h.shape
    if gu.dim() != 3 or gu.shape[2] != hidden_size or gu.shape[1] % 2 or gu.shape[1] == 0:
        raise ValueError(
            "w_gate_up: expected [num_experts, 2 * intermediate_size, hidden_size="
            f"{hidden_size}], got shape {tuple(gu.shape)}"
        )
    experts, inter = gu.shape[0], gu.shape[1] // 2
    if tuple(down.shape) != (experts, hidden_size, inter):
        raise ValueError(
            f"w_down: expected shape {(experts, hidden_size, inter)} "
            f"([num_experts, hidden_size, intermediate_size]), got {tuple(down.shape)}"
        )
    for name, w in (("w_gate_up", gu), ("w_down", down)):
        if w.dtype != h.dtype:
            raise ValueError(f"{name}: expected dtype {h.dtype} (as hidden), got {w.dtype}")
        if w.device != h.device:
            raise ValueError(f"{name}: expected device {h.device} (as hidden), got {w.device}")
    if ti.dim() != 2 or ti.shape[0] != tokens or ti.shape[1] < 1:
        raise ValueError(f"topk_ids: expected [{tokens}, top_k], got shape {tuple(ti.shape)}")
    if ti.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids: expected int32 or int64, got {ti.dtype}")
    if tuple(tw.shape) != tuple(ti.shape):
        raise ValueError(
            f"topk_weights: expected shape {tuple(ti.shape)} (as topk_ids), got {tuple(tw.shape)}"
        )
    if tw.dtype not in FLOAT_DTYPES:
        raise ValueError(f"topk_weights: expected a float dtype, got {tw.dtype}")
    for name, t in (("topk_weights", tw), ("topk_ids", ti)):
        if t.device != h.device:
            raise ValueError(f"{name}: expected device {h.device} (as hidden), got {t.device}")


def check_fused_moe_values(topk_ids: torch.Tensor, num_experts: int) -> None:
    if topk_ids.numel() == 0:
        return
    lo, hi = int(topk_ids.min()), int(topk_ids.max())
    if lo < -1 or hi >= num_experts:
        raise ValueError(
            f"topk_ids: expected expert ids in [0, {num_experts}) or -1 (skipped), "
            f"found {lo if lo < -1 else hi}"
        )
