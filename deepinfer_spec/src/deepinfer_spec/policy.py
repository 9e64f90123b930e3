"""How a speculator verifies and when it drafts, chosen from measurements on this machine.

A serving stack hands over its drafter and a callable that times the target's verify step at
some batch sizes (it owns the KV memory such a forward needs); :func:`choose_policy` returns
the verify scheduler and the draft gate, and switches a CPU drafter to the fastest of the
stack's products. Example::

    scheduler, gate = choose_policy(drafter, lambda sizes: profile_sps(step, sizes))
    spec = BatchSpeculator(drafter, scheduler, max_seqs=8, gate=gate)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from deepinfer_spec.drafter import DSparkDrafter
from deepinfer_spec.linear import LinearFn, module_linear
from deepinfer_spec.scheduling import (
    DraftGate,
    FixedGammaScheduler,
    PrefixScheduler,
    SPSCurve,
    VerifyScheduler,
)
from deepinfer_spec.timing import fastest_linear, priced_gate

TargetProfiler = Callable[[Sequence[int]], SPSCurve | None]
"""Times the target's verify step at these batch sizes; ``None`` when it cannot right now
(no free memory to time it with)."""

# Batch sizes the prefix scheduler's SPS curve is profiled at: powers of two up to a full
# verify of 32 rows (past it the curve is extrapolated linearly).
PROFILE_BATCH_SIZES = (1, 2, 4, 8, 16, 32)
# The gate only needs the 1-token step and what a second token adds.
GATE_BATCH_SIZES = (1, 2)


def choose_policy(
    drafter: DSparkDrafter,
    profile_target: TargetProfiler,
    *,
    scheduler: VerifyScheduler | None = None,
    num_speculative_tokens: int | None = None,
    gate: DraftGate | str | None = "default",
    linears: Sequence[LinearFn] = (),
) -> tuple[VerifyScheduler, DraftGate | None]:
    """The ``(scheduler, gate)`` a speculator over ``drafter`` should run with.

    * ``scheduler``: kept when given; else a fixed count of ``num_speculative_tokens`` drafts
      when given; else DSpark's prefix scheduler over ``profile_target(PROFILE_BATCH_SIZES)``.
    * ``gate``: ``"default"`` is :func:`priced_gate` (drafting pauses while it does not pay
      here) over the curve already profiled or ``profile_target(GATE_BATCH_SIZES)``, and the
      unpriced :class:`DraftGate` when the target cannot be timed; ``None`` drafts on every
      step; a :class:`DraftGate` is kept.
    * ``linears``: the stack's own products for a CPU drafter still on its modules' products;
      the fastest of them and :func:`module_linear` (:func:`fastest_linear`) is installed. A
      product the caller already chose is kept.
    """
    if isinstance(gate, str) and gate != "default":
        raise ValueError(f"gate: expected 'default', None or a DraftGate, got {gate!r}")
    if num_speculative_tokens is not None and scheduler is None:
        scheduler = FixedGammaScheduler(num_speculative_tokens)
    on_cpu = drafter.context_proj.weight.device.type == "cpu"
    if linears and on_cpu and drafter.linear is module_linear:
        drafter.use_linear(fastest_linear(drafter, [*linears, module_linear]))
    curve: SPSCurve | None = None
    if scheduler is None:
        curve = profile_target(PROFILE_BATCH_SIZES)
        if curve is None:
            raise ValueError(
                "profile_target: could not time the target for the prefix scheduler; "
                "pass a scheduler or num_speculative_tokens"
            )
        scheduler = PrefixScheduler(curve)
    if isinstance(gate, str):
        if curve is None:
            curve = profile_target(GATE_BATCH_SIZES)
        gate = DraftGate() if curve is None else priced_gate(drafter, scheduler, curve)
    return scheduler, gate
