"""The DSpark training objective on blocks drawn at random anchor positions.

For a block anchored at position ``n`` of a sequence ``x`` (teacher forcing on the data):
the drafter sees the projected target features of positions ``[n - window, n)`` and the anchor
``x_n``, and predicts ``x_{n+1} .. x_{n+G}`` with ``p_d,k = softmax(U_k + W1[x_{n+k-1}] W2)``.
The target's next-token distribution at position ``n + k - 1`` is ``p_t,k``. Per position:

* ``CE_k  = -log p_d,k(x_{n+k})``
* ``TV_k  = 0.5 * ||p_d,k - p_t,k||_1``
* ``BCE_k = BCE(c_k, c*_k)`` with the soft label ``c*_k = 1 - TV_k`` (detached), which is exactly
  the probability that rejection sampling accepts draft ``k``.

``loss = sum_k w_k (0.1 CE_k + 0.9 TV_k + 1.0 BCE_k) / sum_k w_k`` with
``w_k = exp(-(k-1)/G)``, averaged over blocks.

With a draft vocabulary ``S`` (``DSparkConfig.draft_vocab_size``) ``p_d,k`` is 0 outside ``S``,
so ``TV_k = 0.5 * (sum_{s in S} |p_d,k(s) - p_t,k(s)| + p_t,k(not S))`` exactly, and ``CE_k``
is 0 where ``x_{n+k}`` lies outside ``S`` (it would be infinite: no draft can match it). The
target's side may then come pre-reduced to ``S`` (:class:`DraftVocabTeacher`): same terms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from deepinfer_spec.adapter import TargetOutput
from deepinfer_spec.drafter import DSparkDrafter
from deepinfer_spec.training.teacher import DraftVocabTeacher


@dataclass(frozen=True)
class LossWeights:
    """Coefficients of the loss terms. ``distill`` (0 in the paper's recipe) weights the
    soft-label cross-entropy ``-sum_s p_t,k(s) log p_d,k(s)`` (KL to the target up to a
    constant): like CE its gradient stays large while the drafter is far from the target, but
    it pulls toward the target's distribution rather than toward the data token."""

    ce: float = 0.1
    tv: float = 0.9
    bce: float = 1.0
    distill: float = 0.0

    def __post_init__(self) -> None:
        for name in ("ce", "tv", "bce", "distill"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name}: expected a finite weight >= 0, got {value}")


@dataclass(frozen=True)
class LossTerms:
    """``total`` carries the gradient; the others are detached position-weighted means.

    ``acceptance`` is the mean of ``1 - TV_k`` over positions (unweighted): the expected
    per-position acceptance rate of the drafter under teacher forcing.
    """

    total: torch.Tensor
    ce: float
    tv: float
    bce: float
    acceptance: float
    distill: float = 0.0


def position_weights(gamma: int, device: torch.device | None = None) -> torch.Tensor:
    """``w_k = exp(-(k-1)/gamma)`` for ``k = 1..gamma``."""
    return torch.exp(-torch.arange(gamma, dtype=torch.float32, device=device) / gamma)


def sample_anchors(
    lengths: torch.Tensor, gamma: int, per_sequence: int, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform anchors ``n`` in ``[0, len_b - 1 - gamma]``; sequences too short get none.

    Returns ``(rows [N], anchors [N])``.
    """
    rows, anchors = [], []
    for b, n in enumerate(lengths.tolist()):
        high = int(n) - gamma  # exclusive bound for the anchor
        if high <= 0:
            continue
        picks = torch.randint(0, high, (per_sequence,), generator=generator)
        rows.append(torch.full((per_sequence,), b, dtype=torch.int64))
        anchors.append(picks)
    if not rows:
        raise ValueError(f"input_ids: no sequence is longer than gamma + 1 = {gamma + 1} tokens")
    return torch.cat(rows), torch.cat(anchors)


def dspark_loss(
    drafter: DSparkDrafter,
    input_ids: torch.Tensor,
    target_out: TargetOutput | DraftVocabTeacher,
    rows: torch.Tensor,
    anchors: torch.Tensor,
    weights: LossWeights | None = None,
) -> LossTerms:
    """Loss over the blocks anchored at ``(rows[i], anchors[i])`` of ``input_ids [B, T]``.

    ``target_out`` is the frozen target's ``score(input_ids, config.target_layer_ids)``, or
    for a drafter with a draft vocabulary that output reduced to it
    (:meth:`DraftVocabTeacher.from_target`).
    """
    weights = weights or LossWeights()
    draft_ids = drafter.draft_vocab_ids
    if isinstance(target_out, DraftVocabTeacher) and (
        draft_ids is None or not torch.equal(target_out.draft_vocab_ids, draft_ids)
    ):
        raise ValueError("target_out: reduced to a draft vocabulary that is not the drafter's")
    cfg = drafter.config
    gamma, dev = cfg.gamma, input_ids.device
    rows, anchors = rows.to(dev), anchors.to(dev)
    if int((anchors + gamma).max()) >= input_ids.shape[1]:
        raise ValueError("anchors: every anchor needs gamma tokens after it inside the sequence")
    width = max(1, min(cfg.window, int(anchors.max())))
    ctx_pos = anchors[:, None] - width + torch.arange(width, device=dev)[None, :]
    valid = ctx_pos >= 0
    projected = drafter.project_context(target_out.features.detach())
    # Keys and values depend on a position's own features only: computed once per position of
    # the batch, then gathered per block. Gathering the projected features instead repeated
    # the K/V projections (and their backward) for every block a position falls in, ~24x at
    # 24 anchors per 128 tokens: ~40% of a CPU training step.
    context_kv = drafter.context_kv(projected)[rows[:, None], ctx_pos.clamp(min=0)]
    hidden = drafter.backbone(input_ids[rows, anchors], context_kv, valid, context_is_kv=True)
    block = anchors[:, None] + torch.arange(gamma + 1, device=dev)[None, :]
    tokens = input_ids[rows[:, None], block]  # x_n .. x_{n+G}
    logits, conf_logit = drafter.teacher_forced(hidden, tokens[:, :-1])
    log_pd = F.log_softmax(logits.float(), dim=-1)
    labels = tokens[:, 1:]
    if draft_ids is None:
        assert not isinstance(target_out, DraftVocabTeacher)  # rejected above
        p_t = F.softmax(target_out.logits.detach()[rows[:, None], block[:, :-1]].float(), dim=-1)
        ce = -log_pd.gather(-1, labels[..., None]).squeeze(-1)
        tv = 0.5 * (log_pd.exp() - p_t).abs().sum(-1)
        distill = -(p_t * log_pd).sum(-1)
    else:
        label_index = drafter.draft_index(labels)
        drafted = label_index >= 0
        ce = -log_pd.gather(-1, label_index.clamp(min=0)[..., None]).squeeze(-1)
        ce = torch.where(drafted, ce, torch.zeros_like(ce))
        if isinstance(target_out, DraftVocabTeacher):
            p_t_draft = target_out.log_probs[rows[:, None], block[:, :-1]].exp()
        else:
            p_t = target_out.logits.detach()[rows[:, None], block[:, :-1]].float()
            p_t_draft = F.softmax(p_t, dim=-1)[..., draft_ids]
        outside = (1.0 - p_t_draft.sum(-1)).clamp(min=0.0)
        tv = 0.5 * ((log_pd.exp() - p_t_draft).abs().sum(-1) + outside)
        distill = -(p_t_draft * log_pd).sum(-1)
    soft_label = (1.0 - tv).detach().clamp(0.0, 1.0)
    bce = F.binary_cross_entropy_with_logits(conf_logit.float(), soft_label, reduction="none")
    w = position_weights(gamma, dev)
    per_pos = weights.ce * ce + weights.tv * tv + weights.bce * bce
    if weights.distill:
        per_pos = per_pos + weights.distill * distill
    total = (per_pos * w).sum(-1).mean() / w.sum()

    def wmean(x: torch.Tensor) -> float:
        return float(((x.detach() * w).sum(-1).mean() / w.sum()).item())

    return LossTerms(
        total=total,
        ce=wmean(ce),
        tv=wmean(tv),
        bce=wmean(bce),
        acceptance=float(soft_label.mean().item()),
        distill=wmean(distill),
    )
