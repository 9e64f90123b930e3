"""Measured acceptance of a drafter: speculative decoding with every draft verified."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from deepinfer_spec.adapter import ScoringTarget, TargetAdapter
from deepinfer_spec.calibration import calibrate_sts, calibration_report
from deepinfer_spec.decoder import SpecDecoder
from deepinfer_spec.drafter import DSparkDrafter
from deepinfer_spec.recompute_target import RecomputeTarget
from deepinfer_spec.scheduling import FixedGammaScheduler


@dataclass(frozen=True)
class EvalReport:
    """Acceptance statistics over ``steps`` decoding steps with all ``gamma`` drafts verified.

    Attributes:
        acceptance: ``[G]`` P(draft k accepted | drafts < k accepted), measured.
        tau: mean tokens emitted per step (accepted drafts + the bonus/corrected token).
        steps: number of (request, step) samples.
        ece_before / ece_after: mean survival ECE on the held-out half, raw and after STS.
        temperatures: the STS temperatures fitted on the calibration half.
        calibration: the full ``calibration_report`` of the held-out half.
    """

    acceptance: list[float]
    tau: float
    steps: int
    ece_before: float
    ece_after: float
    temperatures: list[float]
    calibration: dict[str, Any]

    def format(self) -> str:
        lines = [f"steps {self.steps}  tau {self.tau:.3f} (bonus included)"]
        lines.append(
            "acceptance by position: "
            + "  ".join(f"{k + 1}:{a:.3f}" for k, a in enumerate(self.acceptance))
        )
        lines.append(
            f"survival ECE  before STS {self.ece_before:.4f}  after STS {self.ece_after:.4f}"
            f"  (T = {', '.join(f'{t:.2f}' for t in self.temperatures)})"
        )
        return "\n".join(lines)


@torch.no_grad()
def evaluate(
    drafter: DSparkDrafter,
    target: ScoringTarget | TargetAdapter,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int = 32,
    temperature: float = 1.0,
    seed: int = 0,
    verbose: bool = False,
) -> EvalReport:
    """Decode ``prompts`` (one batch) verifying all ``gamma`` drafts each step, and measure.

    A ``ScoringTarget`` without ``extend`` is wrapped in :class:`RecomputeTarget`. The collected
    steps are split alternately into a calibration half (STS is fitted there) and a held-out
    half (ECE is measured there).
    """
    if not prompts:
        raise ValueError("prompts: need at least one prompt")
    adapter = target if isinstance(target, TargetAdapter) else RecomputeTarget(target)
    gamma = drafter.config.gamma
    was_training = drafter.training
    drafter.eval()
    gen = torch.Generator(device=drafter.context_proj.weight.device).manual_seed(seed)
    decoder = SpecDecoder(
        drafter,
        adapter,
        FixedGammaScheduler(gamma),
        max_requests=len(prompts),
        temperature=temperature,
        generator=gen,
    )
    ids = [("eval", i) for i in range(len(prompts))]
    decoder.add_requests(ids, prompts)
    produced: dict[Hashable, int] = dict.fromkeys(ids, 0)
    confs, accs = [], []
    active = list(ids)
    try:
        while active:
            step = decoder.step(active)
            confs.append(step.confidence.float().cpu())
            accs.append(step.num_accepted.cpu())
            for row, rid in enumerate(step.request_ids):
                produced[rid] += int(step.num_emitted[row])
            for rid in [r for r in active if produced[r] >= max_new_tokens]:
                active.remove(rid)
                decoder.release(rid)
    finally:
        for rid in active:
            decoder.release(rid)
    drafter.train(was_training)
    conf = torch.cat(confs)
    num_acc = torch.cat(accs)
    accepted = torch.arange(gamma)[None, :] < num_acc[:, None]
    reached = torch.arange(gamma)[None, :] <= num_acc[:, None]  # drafts < k all accepted
    acceptance = (accepted & reached).sum(0).double() / reached.sum(0).clamp(min=1).double()
    cal, held = conf[0::2], conf[1::2]
    acc_cal, acc_held = accepted[0::2], accepted[1::2]
    if held.shape[0] == 0:
        held, acc_held = cal, acc_cal
    temps = calibrate_sts(cal, acc_cal)
    report = calibration_report(held, acc_held, temps)
    result = EvalReport(
        acceptance=[float(a) for a in acceptance],
        tau=float((num_acc + 1).double().mean()),
        steps=int(conf.shape[0]),
        ece_before=float(report["mean_survival_ece"]),
        ece_after=float(report["calibrated_mean_survival_ece"]),
        temperatures=[float(t) for t in temps],
        calibration=report,
    )
    if verbose:
        print(result.format())
    return result
