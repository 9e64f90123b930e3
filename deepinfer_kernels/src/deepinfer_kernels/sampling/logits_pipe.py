"""``process_logits``: each row's penalties, bias, bans, masks and processors, as one pipeline.

One row of logits is one request at one position; ``RowTransforms`` says what that row is
rewritten with, in plain ids and numbers (an engine turns its request parameters into it).
Rows go, in vLLM's order, through

1. ``apply_penalties`` (repetition over prompt + history, frequency and presence over history),
2. ``logit_bias`` and the ban on ``min_tokens_banned`` while fewer than ``min_tokens`` tokens
   are in the history (one ``apply_logit_bias``),
3. ``allowed_token_ids`` and a grammar's bitmask (one ``apply_token_bitmask``),
4. the row's own ``processors``.

Each stage runs only over the rows that use it, so rows without transforms pay one copy.
Additive bias and masks commute (a masked token stays ``-inf`` whatever is added), so this is
the same result as vLLM's bias, allowed ids, bans, grammar order. ``rescue_dead_rows`` then
keeps one row that allows no token at all from failing a whole batch in ``sample``.

Example::

    rows = [RowTransforms(), RowTransforms(history=[5, 5], frequency_penalty=0.5,
                                           logit_bias={7: 2.0}, allowed_token_ids=[5, 7])]
    out = process_logits(logits, rows)  # float32 [2, V]; row 0 unchanged
    dead = rescue_dead_rows(out, fallback_ids=[eos, eos])
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from deepinfer_kernels.sampling.logit_bias import apply_logit_bias, token_bitmask
from deepinfer_kernels.sampling.penalties import apply_penalties, pad_token_ids, penalties_active
from deepinfer_kernels.sampling.token_mask import apply_token_bitmask


@runtime_checkable
class LogitsProcessor(Protocol):
    """A caller's own rewrite of one row (vLLM's per-request logits processor form).

    Called once per position with the ids generated so far (``history``, not the prompt) and
    that position's float32 logits ``[V]`` (after penalties, bias and masks, before
    temperature); returns the logits to sample from, and may edit ``logits`` in place and
    return it. It must be deterministic in its inputs: under speculative decoding it is called
    for each position of a verify block with the draft tokens before that position appended.

    Example::

        def no_digits(output_token_ids, logits):
            logits[digit_ids] = float("-inf")
            return logits
    """

    def __call__(self, output_token_ids: Seq[int], logits: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class RowTransforms:
    """What one logits row is rewritten with. Defaults rewrite nothing."""

    history: Seq[int] = ()  # ids generated before this position (drafts inside a verify block)
    prompt_ids: Seq[int] = ()  # seen by the repetition penalty only
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Mapping[int, float] | None = None  # ids past the vocabulary are skipped
    min_tokens: int = 0
    min_tokens_banned: Seq[int] = ()  # -inf while len(history) < min_tokens (EOS, stop ids)
    allowed_token_ids: Seq[int] | None = None
    bitmask: torch.Tensor | None = None  # int32 [W]; narrower than the vocabulary: rest banned
    processors: Seq[LogitsProcessor] = ()

    def __post_init__(self) -> None:
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty: must be > 0, got {self.repetition_penalty}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens: must be >= 0, got {self.min_tokens}")
        if self.bitmask is not None and (
            self.bitmask.dtype != torch.int32 or self.bitmask.dim() != 1
        ):
            raise TypeError(
                f"bitmask: expected an int32 [W] tensor, got {self.bitmask.dtype} "
                f"{tuple(self.bitmask.shape)}"
            )

    @property
    def needs_penalties(self) -> bool:
        return penalties_active(
            self.presence_penalty, self.frequency_penalty, self.repetition_penalty
        )

    def bias_entries(self, vocab: int) -> list[tuple[int, float]]:
        """(token id, amount) pairs: ``logit_bias``, then the ``min_tokens`` bans."""
        entries = [(t, v) for t, v in (self.logit_bias or {}).items() if t < vocab]
        if len(self.history) < self.min_tokens:
            entries += [(t, float("-inf")) for t in self.min_tokens_banned if t < vocab]
        return entries

    def token_mask(self, vocab: int) -> torch.Tensor | None:
        """int32 ``[ceil(V / 32)]`` of the tokens ``allowed_token_ids`` and ``bitmask`` both
        permit; ``None`` when neither restricts the row."""
        allowed = self.allowed_token_ids
        mask = None if allowed is None else token_bitmask(list(allowed), vocab)
        if self.bitmask is not None:
            words = -(-vocab // 32)
            grammar = self.bitmask[:words]
            if grammar.shape[0] < words:
                pad = torch.zeros(words - grammar.shape[0], dtype=torch.int32)
                grammar = torch.cat([grammar, pad])
            mask = grammar if mask is None else mask & grammar
        return mask


def process_logits(logits: torch.Tensor, rows: Seq[RowTransforms]) -> torch.Tensor:
    """Float32 ``[R, V]`` copy of ``logits`` (any float dtype, on the host) after each row's
    transforms; ``logits`` is not modified. A processor that returns anything but a ``[V]``
    tensor raises ``ValueError`` naming it."""
    if logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(
            f"logits: expected a floating 2-d tensor [R, V], got {tuple(logits.shape)}"
        )
    if len(rows) != logits.shape[0]:
        raise ValueError(f"rows: expected {logits.shape[0]} (one per logits row), got {len(rows)}")
    out = logits.float().clone()
    vocab = out.shape[1]
    pen = [i for i, r in enumerate(rows) if r.needs_penalties]
    if pen:
        idx, ps = torch.tensor(pen), [rows[i] for i in pen]
        out[idx] = apply_penalties(
            out[idx],
            pad_token_ids([list(p.prompt_ids) for p in ps]),
            pad_token_ids([list(p.history) for p in ps]),
            torch.tensor([p.presence_penalty for p in ps], dtype=torch.float32),
            torch.tensor([p.frequency_penalty for p in ps], dtype=torch.float32),
            torch.tensor([p.repetition_penalty for p in ps], dtype=torch.float32),
        )
    bias = [r.bias_entries(vocab) for r in rows]
    if any(bias):
        width = max(len(b) for b in bias)
        ids = pad_token_ids([[t for t, _ in b] for b in bias])
        amounts = torch.tensor([[v for _, v in b] + [0.0] * (width - len(b)) for b in bias])
        out = apply_logit_bias(out, ids, amounts.reshape(ids.shape))
    masks = [r.token_mask(vocab) for r in rows]
    masked = [i for i, m in enumerate(masks) if m is not None]
    if masked:
        idx = torch.tensor(masked)
        out[idx] = apply_token_bitmask(out[idx], torch.stack([masks[i] for i in masked]))  # type: ignore[misc]
    for i, r in enumerate(rows):
        for proc in r.processors:
            result = proc(tuple(r.history), out[i])
            if not isinstance(result, torch.Tensor) or tuple(result.shape) != (vocab,):
                raise ValueError(
                    f"logits_processors: {proc!r} must return a tensor of shape ({vocab},)"
                )
            out[i] = result
    return out


def rescue_dead_rows(logits: torch.Tensor, fallback_ids: Seq[int | None]) -> list[int]:
    """Rows of ``logits`` ``[R, V]`` that allow no token at all (a grammar in its error state,
    a processor that masked everything) would make ``sample`` refuse the whole batch: each
    such row is rewritten in place to allow only its ``fallback_ids`` entry (an EOS; ``None``:
    token 0). Returns the indices of the rows rewritten, so the caller can end them."""
    if len(fallback_ids) != logits.shape[0]:
        raise ValueError(
            f"fallback_ids: expected {logits.shape[0]} (one per row), got {len(fallback_ids)}"
        )
    dead = (~torch.isfinite(logits).any(dim=-1)).nonzero().flatten().tolist()
    for row in dead:
        fallback = fallback_ids[row]
        logits[row] = float("-inf")
        logits[row, fallback if fallback is not None else 0] = 0.0
    return dead
