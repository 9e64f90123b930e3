"""Per-position calibration report and reliability diagram for the confidence head."""

from __future__ import annotations

import math
import os
from typing import Any

import torch
from torch import Tensor

from deepinfer_spec.calibration.metrics import auc, binned_ece
from deepinfer_spec.calibration.sts import apply_temperatures, check_confidence, survival_targets


def _ece_or_nan(probs: Tensor, labels: Tensor, num_bins: int) -> float:
    if probs.numel() == 0:
        return float("nan")
    return float(binned_ece(probs.to(torch.float64).unsqueeze(0), labels, num_bins)[0])


def _auc_or_nan(scores: Tensor, labels: Tensor) -> float:
    return float("nan") if scores.numel() == 0 else auc(scores, labels)


def _position_metrics(
    conf: Tensor, accepted: Tensor, survival: Tensor, known: Tensor, cond: Tensor, k: int, nb: int
) -> dict[str, float]:
    acc_k = accepted[cond[:, k], k].to(torch.float64)
    c_k = conf[cond[:, k], k]
    surv_pred = torch.cumprod(conf.to(torch.float64), dim=1)[known[:, k], k]
    surv_true = survival[known[:, k], k]
    return {
        "ece": _ece_or_nan(c_k, acc_k, nb),
        "auc": _auc_or_nan(c_k, acc_k),
        "survival_ece": _ece_or_nan(surv_pred, surv_true, nb),
        "survival_auc": _auc_or_nan(surv_pred, surv_true),
        "mean_confidence": float(c_k.to(torch.float64).mean()) if c_k.numel() else float("nan"),
    }


def calibration_report(
    confidence: Tensor,
    accepted: Tensor,
    temperatures: Tensor | None = None,
    *,
    valid: Tensor | None = None,
    num_bins: int = 15,
) -> dict[str, Any]:
    """Per-position ECE and AUC of the confidence head, before and (optionally) after STS.

    For position k (1-based) the report gives, over the rows where 1..k-1 were accepted and k was
    verified: ``n``, ``acceptance_rate``, ``mean_confidence``, ``ece`` and ``auc`` of ``c_k``
    against ``accepted_k``; and over the rows with a known survival: ``survival_ece`` and
    ``survival_auc`` of ``prod_{i<=k} c_i`` against ``prod_{i<=k} accepted_i``. With
    ``temperatures`` the same metrics of the scaled confidences appear under ``calibrated``.
    ``mean_survival_ece`` (and ``calibrated_mean_survival_ece``) average over positions with data.
    All values are plain floats/ints (JSON-ready); undefined metrics are NaN.
    """
    check_confidence(confidence)
    if confidence.dim() != 2:
        raise ValueError(f"confidence must be [N, G], got shape {tuple(confidence.shape)}")
    if not isinstance(accepted, Tensor) or accepted.shape != confidence.shape:
        raise ValueError("accepted must be a tensor with the same shape as confidence")
    survival, known, cond = survival_targets(accepted, valid)
    acc = accepted.to(torch.bool)
    scaled = None if temperatures is None else apply_temperatures(confidence, temperatures)
    positions: list[dict[str, Any]] = []
    for k in range(confidence.shape[1]):
        n_k = int(cond[:, k].sum())
        entry: dict[str, Any] = {
            "position": k + 1,
            "n": n_k,
            "acceptance_rate": float(acc[cond[:, k], k].double().mean()) if n_k else float("nan"),
        }
        entry.update(_position_metrics(confidence, acc, survival, known, cond, k, num_bins))
        if scaled is not None:
            entry["calibrated"] = _position_metrics(scaled, acc, survival, known, cond, k, num_bins)
        positions.append(entry)

    def _mean(values: list[float]) -> float:
        finite = [v for v in values if not math.isnan(v)]
        return sum(finite) / len(finite) if finite else float("nan")

    report: dict[str, Any] = {
        "num_samples": int(confidence.shape[0]),
        "gamma": int(confidence.shape[1]),
        "num_bins": num_bins,
        "positions": positions,
        "mean_survival_ece": _mean([p["survival_ece"] for p in positions]),
    }
    if scaled is not None and temperatures is not None:
        report["temperatures"] = [float(t) for t in temperatures.reshape(-1).tolist()]
        report["calibrated_mean_survival_ece"] = _mean(
            [p["calibrated"]["survival_ece"] for p in positions]
        )
    return report


def _reliability_points(
    pred: Tensor, true: Tensor, num_bins: int
) -> tuple[list[float], list[float]]:
    idx = (pred * num_bins).floor().clamp(0, num_bins - 1).long()
    count = torch.bincount(idx, minlength=num_bins).double()
    sp = torch.bincount(idx, weights=pred.double(), minlength=num_bins)
    sy = torch.bincount(idx, weights=true.double(), minlength=num_bins)
    keep = count > 0
    return (sp[keep] / count[keep]).tolist(), (sy[keep] / count[keep]).tolist()


def reliability_diagram(
    confidence: Tensor,
    accepted: Tensor,
    path: str | os.PathLike[str],
    temperatures: Tensor | None = None,
    *,
    valid: Tensor | None = None,
    num_bins: int = 15,
) -> str:
    """Write a PNG reliability diagram of the survival ``prod_{i<=k} c_i`` per position.

    One curve per position: mean predicted survival per bin against the empirical survival rate.
    With ``temperatures`` a second panel shows the STS-scaled survival. Needs the ``plot`` extra
    (matplotlib, imported here lazily). Returns the written path.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "reliability_diagram needs matplotlib: pip install 'deepinfer-spec[plot]'"
        ) from exc
    check_confidence(confidence)
    if confidence.dim() != 2 or not isinstance(accepted, Tensor):
        raise ValueError("confidence must be [N, G] and accepted a tensor of the same shape")
    if accepted.shape != confidence.shape:
        raise ValueError("accepted must have the same shape as confidence")
    survival, known, _ = survival_targets(accepted, valid)
    panels: list[tuple[str, Tensor]] = [("raw confidence", confidence)]
    if temperatures is not None:
        panels.append(("after STS", apply_temperatures(confidence, temperatures)))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.5), squeeze=False)
    for ax, (title, conf) in zip(axes[0], panels):
        surv_pred = torch.cumprod(conf.detach().cpu().double(), dim=1)
        ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
        for k in range(conf.shape[1]):
            rows = known[:, k].cpu()
            if not rows.any():
                continue
            pred, true = surv_pred[rows, k], survival.cpu()[rows, k]
            xs, ys = _reliability_points(pred, true, num_bins)
            ece = float(binned_ece(pred.unsqueeze(0), true, num_bins)[0])
            ax.plot(xs, ys, marker="o", markersize=3, label=f"k={k + 1} (ECE {ece:.3f})")
        ax.set_title(f"Survival reliability, {title}")
        ax.set_xlabel("predicted survival prod c_i")
        ax.set_ylabel("empirical survival")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    out = os.fspath(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
