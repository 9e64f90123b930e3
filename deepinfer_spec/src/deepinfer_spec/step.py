"""One DSpark step, in two halves around the target's forward: propose -> schedule, then
verify -> accept. `SpecDecoder` and the engine's speculator (``deepinfer.speculative``) both
run exactly these functions; only where the target's forward happens differs.

1. :func:`draft_block`: the drafter proposes ``gamma`` tokens per row (rows grouped by their
   sampling temperature; only the positions the scheduler's bound and the caps let any row
   verify are drawn, see ``BoundedScheduler``), the confidences are calibrated with the STS temperatures of greedy or
   sampled rows, the verification scheduler picks ``n_b`` drafts per row, capped per row;
2. the caller runs the target over ``[anchor ; d_1 .. d_{n_b}]`` of every row;
3. :func:`verify_block`: ``greedy_verify`` (temperature 0) or ``speculative_verify`` accepts a
   prefix of each row's drafts and emits the correction or bonus token.

Example::

    block = draft_block(drafter, anchors, context, valid, [0.0] * B, FixedGammaScheduler(3))
    logits = ...  # target logits at the anchor and drafts, [B, block.width, V]
    verdict = verify_block(block, logits, [0.0] * B)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from deepinfer_kernels import greedy_verify, speculative_verify
from deepinfer_spec.calibration import apply_temperatures
from deepinfer_spec.drafter import DSparkDrafter
from deepinfer_spec.propose import native_greedy, propose
from deepinfer_spec.scheduling import VerifyScheduler, draft_bound


@dataclass(frozen=True)
class DraftBlock:
    """Drafts of ``B`` rows and how many of each to verify.

    ``token_ids [B, G]``; ``confidence [B, G]`` after STS calibration; ``num_draft_tokens [B]``
    int64 on the CPU, in ``[0, G]``; ``probs [B, G, V]`` the draft distributions of sampled rows
    (zeros on greedy rows), ``None`` when every row is greedy.
    """

    token_ids: torch.Tensor
    confidence: torch.Tensor
    num_draft_tokens: torch.Tensor
    probs: torch.Tensor | None

    @property
    def width(self) -> int:
        """Verify positions per row: the anchor plus at least one draft column (the verify
        kernels take ``G >= 1``; rows with fewer drafts are padded)."""
        return max(int(self.num_draft_tokens.max()), 1) + 1

    def drafts(self, row: int) -> list[int]:
        """The drafts of ``row`` that go to verification."""
        n = int(self.num_draft_tokens[row])
        return [int(t) for t in self.token_ids[row, :n].tolist()]


@dataclass(frozen=True)
class Verdict:
    """Per row: ``num_accepted`` drafts, ``num_emitted = num_accepted + 1`` tokens in
    ``output_ids [B, width]`` (then -1 padding)."""

    output_ids: torch.Tensor
    num_accepted: torch.Tensor
    num_emitted: torch.Tensor

    def tokens(self, row: int) -> list[int]:
        return [int(t) for t in self.output_ids[row, : int(self.num_emitted[row])].tolist()]


@torch.no_grad()
def draft_block(
    drafter: DSparkDrafter,
    anchors: torch.Tensor,
    context: torch.Tensor,
    valid: torch.Tensor,
    temperatures: Sequence[float],
    scheduler: VerifyScheduler,
    *,
    sts_greedy: torch.Tensor | None = None,
    sts_sampling: torch.Tensor | None = None,
    max_drafts: Sequence[int] | None = None,
    context_is_kv: bool = False,
    generator: torch.Generator | None = None,
    logits_hook: Callable[[torch.Tensor, int, torch.Tensor, torch.Tensor], torch.Tensor]
    | None = None,
) -> DraftBlock:
    """Propose and schedule one block for every row (see the module docstring).

    ``temperatures[b]``: row ``b``'s sampling temperature (0: greedy); ``sts_greedy`` /
    ``sts_sampling``: STS temperatures ``[G]`` for greedy / sampled rows (``None``: raw
    confidence); ``max_drafts[b]``: cap on row ``b``'s verified drafts. ``logits_hook(rows, k,
    prefix, logits)``: ``propose``'s hook, told which rows of this batch it is given.
    """
    batch, gamma = int(anchors.shape[0]), drafter.config.gamma
    if len(temperatures) != batch:
        raise ValueError(f"temperatures: expected {batch} values, got {len(temperatures)}")
    if max_drafts is not None and len(max_drafts) != batch:
        raise ValueError(f"max_drafts: expected {batch} values, got {len(max_drafts)}")
    device = anchors.device
    # Positions no row can verify are not drawn: the scheduler's bound, the callers' caps.
    width = draft_bound(scheduler, batch, gamma)
    if max_drafts is not None and batch:
        width = min(width, max(int(m) for m in max_drafts))
    width = max(width, 1)  # a zero-draft step still proposes one position (never verified)
    probs: torch.Tensor | None = None
    temps = [float(t) for t in temperatures]
    groups = sorted(set(temps))
    tokens: torch.Tensor | None = None
    conf: torch.Tensor | None = None
    if len(groups) > 1:  # each group writes its rows
        tokens = torch.zeros(batch, gamma, dtype=torch.int64, device=device)
        conf = torch.zeros(batch, gamma, dtype=torch.float32, device=device)
    for temp in groups:
        # One group (the usual step: every row greedy) reads the inputs as they are; indexing
        # would copy every row's whole context window.
        whole = len(groups) == 1
        drawn = None
        if whole and temp == 0 and logits_hook is None:
            # Greedy rows never read their one-hot probs: the compiled call's tokens alone.
            drawn = native_greedy(
                drafter, anchors, context, valid, context_is_kv=context_is_kv, num_tokens=width
            )
        if drawn is None:
            rows = torch.tensor([i for i, t in enumerate(temps) if t == temp], device=device)
            d = propose(
                drafter,
                anchors if whole else anchors[rows],
                context if whole else context[rows],
                valid if whole else valid[rows],
                temperature=temp,
                generator=generator,
                context_is_kv=context_is_kv,
                logits_hook=_rows_hook(logits_hook, rows),
                num_tokens=width,
            )
            drawn = (d.token_ids, d.confidence)
            if temp > 0:
                if probs is None:
                    probs = torch.zeros(batch, gamma, d.probs.shape[-1], device=device)
                probs[slice(None) if whole else rows, :width] = d.probs
        # Undrawn positions keep token 0 and confidence 0: no scheduler admits them (and the
        # bound above says none could have).
        sts = sts_greedy if temp == 0 else sts_sampling
        drawn_conf = calibrated(drawn[1], sts[:width]) if sts is not None else drawn[1]
        if tokens is None or conf is None:  # one group: its block padded to G columns
            tokens = _pad_columns(drawn[0], gamma)
            conf = _pad_columns(drawn_conf, gamma)
        else:
            tokens[rows, :width] = drawn[0]
            conf[rows, :width] = drawn_conf
    if tokens is None or conf is None:  # no rows at all
        tokens = torch.zeros(batch, gamma, dtype=torch.int64, device=device)
        conf = torch.zeros(batch, gamma, dtype=torch.float32, device=device)
    n = _checked_schedule(scheduler.schedule(conf), batch, gamma)
    caps = [width] * batch if max_drafts is None else [min(width, int(m)) for m in max_drafts]
    counts = [max(0, min(v, cap)) for v, cap in zip(n, caps)]
    return DraftBlock(tokens, conf, torch.tensor(counts, dtype=torch.int64), probs)


# Confidence blocks up to this many values are calibrated on Python floats (a batch-1 step's
# block is one to five): fewer than a tensor op's dispatch per value.
SMALL_CALIBRATION = 64


def calibrated(confidence: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """``apply_temperatures(confidence, temperatures)`` for a ``[B, m]`` block; a small block
    (:data:`SMALL_CALIBRATION` values) in float64 on Python floats, as the op computes it
    (``sigmoid(logit(clamp(c, 1e-6, 1 - 1e-6)) / T)``, then float32): its ~15 tensor ops (value
    checks, dtype casts) were ~0.25 ms of a ~18 ms batch-1 CPU drafting step. Same errors for
    a confidence that is NaN or not a probability; equal to the op's values to float32
    rounding of float64 functions (``math`` against torch's kernels)."""
    if (
        confidence.numel() > SMALL_CALIBRATION
        or confidence.dim() != 2
        or confidence.dtype != torch.float32
        or tuple(temperatures.shape) != (confidence.shape[-1],)
    ):
        return apply_temperatures(confidence, temperatures)
    temps = [float(t) for t in temperatures.tolist()]
    if not all(math.isfinite(t) and t > 0 for t in temps):
        raise ValueError("temperatures must be finite and > 0")
    out = []
    for row in confidence.tolist():
        values = []
        for c, t in zip(row, temps):
            if c != c:
                raise ValueError("confidence must not contain NaN")
            if not 0.0 <= c <= 1.0:
                raise ValueError("confidence must hold probabilities in [0, 1]")
            p = min(max(c, _EPS), 1.0 - _EPS)
            values.append(_sigmoid((math.log(p) - math.log1p(-p)) / t))
        out.append(values)
    got = torch.tensor(out, dtype=torch.float32, device=confidence.device)
    return got if out else got.reshape(confidence.shape)


_EPS = 1e-6  # apply_temperatures' clamp


def _sigmoid(z: float) -> float:
    # torch's formula; past -700 exp(-z) would overflow a float where torch gets 1 / inf = 0.
    return 0.0 if z < -700.0 else 1.0 / (1.0 + math.exp(-z))


def _pad_columns(values: torch.Tensor, gamma: int) -> torch.Tensor:
    """``values [B, m]`` with zero columns up to ``[B, gamma]`` (one op; as it is when full)."""
    width = int(values.shape[1])
    if width == gamma:
        return values
    return torch.nn.functional.pad(values, (0, gamma - width))


def _rows_hook(
    hook: Callable[[torch.Tensor, int, torch.Tensor, torch.Tensor], torch.Tensor] | None,
    rows: torch.Tensor,
) -> Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor] | None:
    if hook is None:
        return None
    return lambda k, prefix, logits: hook(rows, k, prefix, logits)


def verify_block(
    block: DraftBlock,
    logits: torch.Tensor,
    temperatures: Sequence[float],
    *,
    target_probs: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    check_values: bool = True,
) -> Verdict:
    """Accept a prefix of every row's drafts (lossless; greedy rows token-exact).

    ``logits [B, width, V]``: the target at each row's anchor and drafts (positions past a
    row's ``n_b`` may hold anything). Sampled rows verify against ``target_probs [B, width, V]``
    when given (the exact distribution the request samples from, filters included), else
    ``softmax(logits / T)``. ``check_values=False`` skips the kernels' value scans when the
    caller built the operands itself.
    """
    batch, width = block.token_ids.shape[0], block.width
    if tuple(logits.shape[:2]) != (batch, width):
        raise ValueError(f"logits: expected [{batch}, {width}, V], got {tuple(logits.shape)}")
    if len(temperatures) != batch:
        raise ValueError(f"temperatures: expected {batch} values, got {len(temperatures)}")
    n = block.num_draft_tokens
    logits = logits.float().cpu()
    drafts = block.token_ids[:, : width - 1].cpu()
    # Positions past a row's drafts are not verified: make them harmless for the value checks.
    live = (torch.arange(width)[None, :] <= n[:, None])[..., None]
    output_ids = torch.full((batch, width), -1, dtype=torch.int64)
    num_acc = torch.zeros(batch, dtype=torch.int64)
    num_emit = torch.zeros(batch, dtype=torch.int64)
    greedy = [i for i, t in enumerate(temperatures) if t == 0]
    sampled = [i for i, t in enumerate(temperatures) if t > 0]
    if greedy and not sampled and not check_values:
        _greedy_rows(drafts, logits, n, output_ids, num_acc, num_emit)
    elif greedy:
        g = torch.tensor(greedy)
        rows = logits[g] if not check_values else torch.where(live[g], logits[g], 0.0)
        res = greedy_verify(drafts[g], rows, n[g], check_values=check_values)
        output_ids[g], num_acc[g], num_emit[g] = res.output_ids, res.num_accepted, res.num_emitted
    if sampled:
        s = torch.tensor(sampled)
        if block.probs is None:
            raise ValueError("block: sampled rows need the draft distributions (probs)")
        if target_probs is not None:
            target = target_probs[s].float().cpu()
        else:
            temps = torch.tensor([float(temperatures[i]) for i in sampled])[:, None, None]
            target = torch.softmax(logits[s] / temps, dim=-1)
        target = torch.where(live[s], target, torch.full((), 1.0 / target.shape[-1]))
        res = speculative_verify(
            drafts[s], block.probs[s, : width - 1].cpu(), target, n[s], generator=generator
        )
        output_ids[s], num_acc[s], num_emit[s] = res.output_ids, res.num_accepted, res.num_emitted
    return Verdict(output_ids, num_acc, num_emit)


def _greedy_rows(
    drafts: torch.Tensor,
    logits: torch.Tensor,
    n: torch.Tensor,
    output_ids: torch.Tensor,
    num_acc: torch.Tensor,
    num_emit: torch.Tensor,
) -> None:
    """``greedy_verify``'s rule for a batch of greedy rows whose operands the caller built
    (no value checks), through :func:`greedy_accepts`: the kernel's general path (masks,
    gathers, its op dispatch) was ~1 ms of a ~30 ms CPU decode step."""
    counts = n.tolist()
    rows = [d[:c] for d, c in zip(drafts.tolist(), counts)]
    for b, (acc, tokens) in enumerate(greedy_accepts(rows, target_argmax(logits))):
        output_ids[b, : acc + 1] = torch.tensor(tokens)
        num_acc[b], num_emit[b] = acc, acc + 1


def target_argmax(logits: torch.Tensor) -> list[list[int]]:
    """``torch.argmax(logits, dim=-1).tolist()`` of ``[B, W, V]`` logits (the first maximum;
    a NaN wins, as in torch). fp32 CPU logits go through numpy, a view: over a 49k vocabulary
    torch's reduction was ~0.15 ms of a batch-1 verify block, numpy's ~20x less (as the
    engine's ``greedy_tokens`` found for the plain step)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and not logits.requires_grad:
        best: list[list[int]] = logits.numpy().argmax(axis=-1).tolist()
        return best
    return torch.argmax(logits, dim=-1).tolist()


def greedy_accepts(
    drafts: Sequence[Sequence[int]], best: Sequence[Sequence[int]]
) -> list[tuple[int, list[int]]]:
    """Greedy verification on plain ints: per row, ``(accepted, emitted tokens)`` for its
    verified ``drafts[b]`` against ``best[b]``, the target's argmax at the anchor and after
    each draft (ties: the lowest id, as ``torch.argmax``). Accept while the draft equals the
    argmax, then emit the argmax (the correction, or the bonus after all of them). A batch-1
    step's verdict is a few ints: on them Python costs less than any tensor op's dispatch."""
    out = []
    for row_drafts, row_best in zip(drafts, best):
        acc, count = 0, len(row_drafts)
        while acc < count and row_drafts[acc] == row_best[acc]:
            acc += 1
        out.append((acc, [*row_drafts[:acc], row_best[acc]]))
    return out


def _checked_schedule(n: torch.Tensor, batch: int, gamma: int) -> list[int]:
    """The scheduler's ``num_draft_tokens`` as ints, checked (one read of the tensor)."""
    if not isinstance(n, torch.Tensor) or tuple(n.shape) != (batch,):
        raise ValueError(f"scheduler: expected num_draft_tokens of shape [{batch}], got {n!r}")
    if n.dtype.is_floating_point or n.dtype == torch.bool:
        raise TypeError(f"scheduler: expected integer num_draft_tokens, got {n.dtype}")
    values = [int(v) for v in n.tolist()]
    if values and (min(values) < 0 or max(values) > gamma):
        raise ValueError(f"scheduler: num_draft_tokens must lie in [0, {gamma}], got {n}")
    return values
