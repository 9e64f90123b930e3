"""Verification scheduling: how many draft tokens of each request the target verifies per step.

Example::

    import torch
    from deepinfer_spec.scheduling import PrefixScheduler, SPSCurve

    sps = SPSCurve.roofline(weight_read_s=4.8e-3, per_token_s=40e-6)
    plan = PrefixScheduler(sps).plan(torch.full((64, 5), 0.8))
    print(plan.num_draft_tokens, plan.expected_tau, plan.batch_size)
"""

from deepinfer_spec.scheduling.base import (
    BoundedScheduler,
    SchedulePlan,
    VerifyScheduler,
    draft_bound,
    evaluate_schedule,
)
from deepinfer_spec.scheduling.fixed import FixedGammaScheduler
from deepinfer_spec.scheduling.gate import DraftGate
from deepinfer_spec.scheduling.prefix import PrefixScheduler
from deepinfer_spec.scheduling.sps import SPSCurve, profile_sps
from deepinfer_spec.scheduling.threshold import ThresholdScheduler

__all__ = [
    "BoundedScheduler",
    "DraftGate",
    "FixedGammaScheduler",
    "PrefixScheduler",
    "SPSCurve",
    "SchedulePlan",
    "ThresholdScheduler",
    "VerifyScheduler",
    "draft_bound",
    "evaluate_schedule",
    "profile_sps",
]
