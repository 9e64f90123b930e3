"""``apply_penalties``: presence, frequency and repetition penalties for a batch (public op).

Token histories arrive as padded id matrices (``-1`` pads), so building them costs the
history's length, not the vocabulary's, and so does applying them: the penalised columns are
gathered, rewritten and scattered back; the rest of the logits is one copy.
"""

from __future__ import annotations

from typing import Any

import torch

from deepinfer_kernels._dispatch import eager_or_op
from deepinfer_kernels._interop import result_converter, to_torch
from deepinfer_kernels.sampling.params import _as_row_tensor
from deepinfer_kernels.verify.validate import want_value_checks


def _apply_penalties_impl(
    logits: torch.Tensor,
    prompt_ids: torch.Tensor,
    output_ids: torch.Tensor,
    presence_penalty: torch.Tensor,
    frequency_penalty: torch.Tensor,
    repetition_penalty: torch.Tensor,
) -> torch.Tensor:
    # Only the history's columns change, so the work is gathers and scatters over the
    # histories (B x L), not passes over the vocabulary (B x V): a column past the vocabulary
    # absorbs the pads. A token repeated in a history is written several times with one value.
    batch, vocab = logits.shape
    x = torch.empty(batch, vocab + 1, dtype=torch.float32, device=logits.device)
    x[:, :vocab] = logits
    seen = torch.cat([prompt_ids, output_ids], dim=1)
    seen = torch.where(seen < 0, vocab, seen)
    old = x.gather(1, seen)
    rep = repetition_penalty[:, None]
    x.scatter_(1, seen, torch.where(old > 0, old / rep, old * rep))
    out = torch.where(output_ids < 0, vocab, output_ids)
    counts = torch.zeros(batch, vocab + 1, dtype=torch.float32, device=logits.device)
    counts.scatter_add_(1, out, torch.ones_like(out, dtype=torch.float32))
    penalty = frequency_penalty[:, None] * counts.gather(1, out) + presence_penalty[:, None]
    x.scatter_(1, out, x.gather(1, out) - penalty)
    return x[:, :vocab].contiguous()


_apply_penalties_op = torch.library.custom_op(
    "deepinfer::apply_penalties", _apply_penalties_impl, mutates_args=()
)


@_apply_penalties_op.register_fake
def _(
    logits: torch.Tensor,
    prompt_ids: torch.Tensor,
    output_ids: torch.Tensor,
    presence_penalty: torch.Tensor,
    frequency_penalty: torch.Tensor,
    repetition_penalty: torch.Tensor,
) -> torch.Tensor:
    return logits.new_empty(logits.shape, dtype=torch.float32)


def _id_matrix(
    value: Any, name: str, batch: int, vocab: int, device: torch.device, check: bool
) -> torch.Tensor:
    t: torch.Tensor = to_torch(value, name)
    if t.dim() != 2 or t.shape[0] != batch:
        raise ValueError(f"{name}: expected shape [{batch}, L] (pad with -1), got {tuple(t.shape)}")
    if t.is_floating_point() or t.dtype == torch.bool:
        raise TypeError(f"{name}: expected an integer tensor, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name}: expected device {device}, got {t.device}")
    t = t.to(torch.int64)
    if check and t.numel() and int(t.max()) >= vocab:
        raise ValueError(f"{name}: token ids must be < vocabulary size {vocab} (pads are -1)")
    return t


def penalties_active(
    presence_penalty: float, frequency_penalty: float, repetition_penalty: float
) -> bool:
    """Whether :func:`apply_penalties` with these values changes any logit (0, 0 and 1 are
    its identity), so callers can skip it for rows that ask for none."""
    return presence_penalty != 0.0 or frequency_penalty != 0.0 or repetition_penalty != 1.0


def apply_penalties(
    logits: Any,
    prompt_ids: Any,
    output_ids: Any,
    presence_penalty: Any = 0.0,
    frequency_penalty: Any = 0.0,
    repetition_penalty: Any = 1.0,
    *,
    check_values: bool = True,
) -> Any:
    """Penalised float32 copy of ``logits`` ``[B, V]`` (vLLM's / OpenAI's definitions).

    ``prompt_ids`` ``[B, P]`` and ``output_ids`` ``[B, O]`` hold each row's token history,
    padded with ``-1``. Penalties are per row (``[B]`` tensors or scalars):

    * ``repetition_penalty`` (> 0, 1 = off): tokens in the prompt or the output have positive
      logits divided by it and negative ones multiplied by it;
    * ``frequency_penalty``: subtracted once per occurrence in the output;
    * ``presence_penalty``: subtracted once if the token occurs in the output.

    ``check_values`` (skipped while ``torch.compile`` traces) checks ids and penalties on
    the host.

    Example::

        logits = apply_penalties(logits, prompt_ids, output_ids, presence_penalty=0.5)
    """
    convert = result_converter(logits)
    x = to_torch(logits, "logits")
    if x.dim() != 2 or not x.is_floating_point():
        raise ValueError("logits: expected a floating 2-d tensor [B, V]")
    batch, vocab = x.shape
    dev = x.device
    check = want_value_checks(check_values)
    prompt = _id_matrix(prompt_ids, "prompt_ids", batch, vocab, dev, check)
    output = _id_matrix(output_ids, "output_ids", batch, vocab, dev, check)
    presence = _as_row_tensor(presence_penalty, "presence_penalty", batch, dev, torch.float32)
    frequency = _as_row_tensor(frequency_penalty, "frequency_penalty", batch, dev, torch.float32)
    repetition = _as_row_tensor(repetition_penalty, "repetition_penalty", batch, dev, torch.float32)
    if check and batch and not bool((torch.isfinite(repetition) & (repetition > 0)).all()):
        raise ValueError("repetition_penalty: every entry must be finite and > 0 (1 = off)")
    if check and batch and not bool((torch.isfinite(presence) & torch.isfinite(frequency)).all()):
        raise ValueError("presence_penalty / frequency_penalty: entries must be finite")
    result = eager_or_op(_apply_penalties_op, _apply_penalties_impl)(
        x, prompt, output, presence, frequency, repetition
    )
    return convert(result)


def pad_token_ids(rows: list[list[int]], device: torch.device | str = "cpu") -> torch.Tensor:
    """``[B, max len]`` int64 matrix of ``rows``, padded with ``-1`` (the penalties' input)."""
    width = max((len(r) for r in rows), default=0)
    padded = [list(r) + [-1] * (width - len(r)) for r in rows]
    return torch.tensor(padded, dtype=torch.int64).reshape(len(rows), width).to(device)
