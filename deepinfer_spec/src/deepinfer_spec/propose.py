"""Drawing a draft block from the drafter.

The backbone runs once; tokens are then drawn left to right because the sequential head's bias
for token ``k`` depends on token ``k - 1``. ``Draft.probs[b, k]`` is exactly the distribution
``draft.token_ids[b, k]`` was drawn from,
``softmax((U_k + bias(x_{k-1})) / temperature)``: rejection sampling is lossless only if it is
given that distribution.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from deepinfer_spec.drafter import DSparkDrafter, NativeDraft


@dataclass(frozen=True)
class Draft:
    """A batch of draft blocks.

    Attributes:
        token_ids: ``[B, G]`` int64.
        probs: ``[B, G, V]`` float32, the distributions the tokens were drawn from (one-hot in
            greedy mode).
        confidence: ``[B, G]`` float32, ``c_k`` = P(token k survives | tokens < k survived).
    """

    token_ids: torch.Tensor
    probs: torch.Tensor
    confidence: torch.Tensor


@torch.no_grad()
def propose(
    drafter: DSparkDrafter,
    anchor_ids: torch.Tensor,
    context: torch.Tensor,
    context_valid: torch.Tensor,
    *,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    context_is_kv: bool = False,
    logits_hook: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    num_tokens: int | None = None,
) -> Draft:
    """Propose ``gamma`` tokens after each anchor (the first ``num_tokens`` of them).

    Args:
        anchor_ids: ``[B]`` last token emitted for each request (not yet seen by the target).
        context: ``[B, W, H]`` projected context features (``DSparkDrafter.project_context``),
            oldest first, ending right before the anchor; with ``context_is_kv`` their keys
            and values ``[B, W, context_kv_dim]`` (``DSparkDrafter.context_kv``).
        context_valid: ``[B, W]`` bool, False for padding.
        temperature: ``> 0`` samples from ``softmax(logits / temperature)``; ``0`` is greedy
            (argmax, lowest index on ties; ``probs`` one-hot). With a draft vocabulary (see
            :meth:`DSparkDrafter.restrict_vocab`) only its tokens are drawn, and ``probs`` is
            still over the whole vocabulary, 0 outside the draft vocabulary.
        generator: source of randomness for sampling.
        logits_hook: ``(k, prefix [B, k], logits) -> logits`` rewrites token ``k``'s logits
            (over the draft vocabulary's columns when there is one) before it is drawn, e.g. a
            structured-output mask; ``probs`` is then the rewritten distribution, so
            verification stays lossless. It must leave each row at least one finite logit.
        num_tokens: draw only block positions ``1..num_tokens`` (``None``: all ``gamma``); the
            result has ``num_tokens`` columns, each equal to the full proposal's (the backbone
            still reads the whole block: its positions attend to each other). Saves the head,
            sequential step and confidence of drafts that cannot be verified.
    """
    if not isinstance(temperature, (int, float)) or temperature < 0:
        raise ValueError(f"temperature: expected a float >= 0, got {temperature!r}")
    vocab = drafter.vocab_size
    _check_anchors(anchor_ids, vocab)
    full = drafter.config.gamma
    _check_num_tokens(num_tokens, full)
    native = drafter.native
    if (
        native is not None
        and temperature == 0
        and logits_hook is None
        and context_is_kv
        and not torch.is_grad_enabled()
    ):
        tokens, conf = _native_tokens(
            drafter, native, anchor_ids, context, context_valid, num_tokens
        )
        probs = torch.zeros(tokens.shape[0], tokens.shape[1], vocab)
        probs.scatter_(2, tokens[..., None], 1.0)
        return Draft(token_ids=tokens, probs=probs, confidence=conf)
    hidden = drafter.backbone(anchor_ids, context, context_valid, context_is_kv=context_is_kv)
    if num_tokens is not None and num_tokens < full:
        hidden = hidden[:, :num_tokens]
    base = drafter.base_logits(hidden).float()
    batch, gamma = hidden.shape[0], hidden.shape[1]
    draft_ids = drafter.draft_vocab_ids  # None: logits are over the whole vocabulary
    tokens = torch.empty(batch, gamma, dtype=torch.int64, device=hidden.device)
    probs = torch.zeros(batch, gamma, vocab, dtype=torch.float32, device=hidden.device)
    prev = anchor_ids.to(torch.int64)
    code: torch.Tensor | None = None
    codes: list[torch.Tensor] = []
    for k in range(gamma):
        bias, code = drafter.sequential_step(prev, code)
        codes.append(code)
        logits = base[:, k] + bias.float()
        if logits_hook is not None:
            logits = logits_hook(k, tokens[:, :k], logits)
        if temperature == 0:
            prev = drafter.draft_token_ids(torch.argmax(logits, dim=-1))
            probs[:, k].scatter_(1, prev[:, None], 1.0)
        else:
            p = torch.softmax(logits / temperature, dim=-1)
            index = torch.multinomial(p, 1, generator=generator).squeeze(1)
            prev = drafter.draft_token_ids(index)
            if draft_ids is None:
                probs[:, k] = p
            else:  # tokens outside the draft vocabulary keep probability 0
                probs[:, k, draft_ids] = p
        tokens[:, k] = prev
    # The confidences need every code but feed nothing back: one product for the whole block.
    conf = torch.sigmoid(drafter.confidence_logit(hidden, torch.stack(codes, dim=1)).float())
    return Draft(token_ids=tokens, probs=probs, confidence=conf)


def native_greedy(
    drafter: DSparkDrafter,
    anchor_ids: torch.Tensor,
    context: torch.Tensor,
    context_valid: torch.Tensor,
    *,
    context_is_kv: bool = False,
    num_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """:func:`propose`'s greedy block without ``probs``: ``(token_ids, confidence)``, the
    same tensors, when it would take the drafter's compiled call (``DSparkDrafter.use_native``,
    ``context_is_kv``, no autograd), else ``None``. For callers that never read the one-hot
    distributions of greedy rows (``draft_block``): a ``[B, G, vocab]`` zero fill and scatter
    fewer per step."""
    native = drafter.native
    if native is None or not context_is_kv or torch.is_grad_enabled():
        return None
    _check_anchors(anchor_ids, drafter.vocab_size)
    _check_num_tokens(num_tokens, drafter.config.gamma)
    return _native_tokens(drafter, native, anchor_ids, context, context_valid, num_tokens)


def _check_anchors(anchor_ids: torch.Tensor, vocab: int) -> None:
    # A few ids read once as ints: one op, where min() and max() were two and two reads.
    ids = anchor_ids.reshape(-1).tolist()
    if ids and (min(ids) < 0 or max(ids) >= vocab):
        raise ValueError(f"anchor_ids: expected token ids in [0, {vocab})")


def _check_num_tokens(num_tokens: int | None, full: int) -> None:
    if num_tokens is not None and (
        not isinstance(num_tokens, int)
        or isinstance(num_tokens, bool)
        or not 0 < num_tokens <= full
    ):
        raise ValueError(f"num_tokens: expected an int in [1, {full}] or None, got {num_tokens!r}")


def _native_tokens(
    drafter: DSparkDrafter,
    native: NativeDraft,
    anchor_ids: torch.Tensor,
    context: torch.Tensor,
    context_valid: torch.Tensor,
    num_tokens: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The greedy block as one compiled call (``DSparkDrafter.use_native``): the same tokens
    as the modules' path up to fp32 rounding of near-ties, the confidences to rounding."""
    gamma = drafter.config.gamma if num_tokens is None else num_tokens
    if tuple(context_valid.shape) != tuple(context.shape[:2]) or context_valid.dtype != torch.bool:
        raise ValueError(f"context_valid: expected bool {list(context.shape[:2])}")
    valid = None if bool(context_valid.all()) else context_valid
    anchor = drafter.target.embed(anchor_ids)
    return native.greedy(anchor, anchor_ids, context, valid, gamma)
