"""`SpeculativeConfig` and `load_speculator`: a serving stack's speculator from a checkpoint.

What a serving stack asks for (which drafter, a fixed number of drafts to verify or DSpark's
prefix scheduler, the draft gate on or off) in a form that crosses processes, and the one call
that turns it into a ready :class:`BatchSpeculator`: the drafter and its STS temperatures from
a checkpoint directory (:func:`~deepinfer_spec.training.load_checkpoint`), the verify policy
measured on this machine (:func:`choose_policy`), and the temperatures applied to the
drafter's confidence on greedy and sampled rows. Example::

    config = SpeculativeConfig("runs/drafter", num_speculative_tokens=3)
    spec = load_speculator(config.model, target, lambda sizes: profile_target(target, sizes),
                           max_seqs=8, num_speculative_tokens=config.num_speculative_tokens)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from deepinfer_spec.adapter import ScoringTarget
from deepinfer_spec.batch_step import BatchSpeculator
from deepinfer_spec.drafter import DSparkDrafter, NativeDraft
from deepinfer_spec.linear import LinearFn
from deepinfer_spec.policy import TargetProfiler, choose_policy
from deepinfer_spec.scheduling import DraftGate, VerifyScheduler
from deepinfer_spec.training.checkpoint import load_checkpoint

__all__ = ["SpeculativeConfig", "load_speculator"]


@dataclass(frozen=True)
class SpeculativeConfig:
    """DSpark speculative decoding, in a form that crosses processes (PD workers, replicas).

    ``model``: a ``deepinfer-spec`` drafter checkpoint directory, or a name the serving stack
    resolves (DeepInfer: ``"dspark"``, the drafter shipped for its embedded model).
    ``num_speculative_tokens``: ``None`` lets DSpark's prefix scheduler choose per step how many
    drafts to verify, from the drafts' confidence and the target's step times profiled at
    start; an int ``k`` verifies ``min(k, gamma)`` drafts of every drafting row (vLLM's fixed
    ``num_speculative_tokens``; ``0`` drafts nothing). ``draft_gate``: pause drafting while it
    does not pay on this machine (measured); ``False`` drafts on every decode step. Neither
    setting changes the output distribution.

    Example::

        LLM(speculative=SpeculativeConfig("dspark", num_speculative_tokens=3))
    """

    model: str = "dspark"
    num_speculative_tokens: int | None = None
    draft_gate: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.model, (str, os.PathLike)) or not os.fspath(self.model):
            raise ValueError(
                f"model: expected 'dspark' or a drafter checkpoint directory, got {self.model!r}"
            )
        object.__setattr__(self, "model", os.fspath(self.model))
        k = self.num_speculative_tokens
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 0):
            raise ValueError(f"num_speculative_tokens: expected None or an int >= 0, got {k!r}")
        if not isinstance(self.draft_gate, bool):
            raise ValueError(f"draft_gate: expected a bool, got {self.draft_gate!r}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (what a worker process is started with)."""
        return dataclasses.asdict(self)


def load_speculator(
    drafter: str | os.PathLike[str] | DSparkDrafter,
    target: ScoringTarget,
    profile_target: TargetProfiler,
    *,
    max_seqs: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    scheduler: VerifyScheduler | None = None,
    num_speculative_tokens: int | None = None,
    gate: DraftGate | str | None = "default",
    linears: Sequence[LinearFn] = (),
    native: Callable[[DSparkDrafter], NativeDraft | None] | None = None,
) -> BatchSpeculator:
    """A :class:`BatchSpeculator` over ``drafter`` for up to ``max_seqs`` sequences.

    ``drafter``: a checkpoint directory (loaded for ``target`` on ``device``, cast to
    ``dtype`` when given, with its ``sts.json`` temperatures if it has one) or a drafter (no
    temperatures). ``profile_target``, ``scheduler``, ``num_speculative_tokens``, ``gate`` and
    ``linears`` as in :func:`choose_policy`. ``native(drafter)``: the drafter's compiled
    greedy block (``deepinfer_spec.native_draft.native_draft_kernel`` over the stack's head
    rows), plugged in before the policy is priced, or ``None`` where it cannot run. A
    directory that is not a checkpoint raises ``ValueError`` naming ``drafter``.
    """
    sts: dict[str, torch.Tensor] = {}
    if not isinstance(drafter, DSparkDrafter):
        try:
            drafter, sts = load_checkpoint(drafter, target, device, dtype)
        except ValueError as exc:
            raise ValueError(f"drafter: {exc}") from exc
    if native is not None and (kernel := native(drafter)) is not None:
        drafter.use_native(kernel)
    scheduler, chosen_gate = choose_policy(
        drafter,
        profile_target,
        scheduler=scheduler,
        num_speculative_tokens=num_speculative_tokens,
        gate=gate,
        linears=linears,
    )
    return BatchSpeculator(
        drafter,
        scheduler,
        max_seqs=max_seqs,
        sts_greedy=sts.get("greedy"),
        sts_sampling=sts.get("sampling"),
        gate=chosen_gate,
    )
