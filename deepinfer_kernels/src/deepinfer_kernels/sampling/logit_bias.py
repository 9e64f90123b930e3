"""``apply_logit_bias``: sparse per-row additions to a batch of logits (public op).

One op serves OpenAI's ``logit_bias`` (a finite amount per token id) and token bans (``-inf``,
e.g. EOS before ``min_tokens``): each row names a few token ids, padded with ``-1``, so the
cost is the number of ids, not the vocabulary. ``token_bitmask`` packs a list of allowed ids
into the int32 layout ``apply_token_bitmask`` reads (OpenAI's ``allowed_token_ids``).
"""

from __future__ import annotations

from typing import Any

import torch

from deepinfer_kernels._dispatch import eager_or_op
from deepinfer_kernels._interop import result_converter, to_torch
from deepinfer_kernels.verify.validate import want_value_checks


def _apply_logit_bias_impl(
    logits: torch.Tensor, token_ids: torch.Tensor, bias: torch.Tensor
) -> torch.Tensor:
    # A column past the vocabulary absorbs the pads; an id named twice gets both amounts.
    batch, vocab = logits.shape
    x = torch.empty(batch, vocab + 1, dtype=torch.float32, device=logits.device)
    x[:, :vocab] = logits
    x.scatter_add_(1, torch.where(token_ids < 0, vocab, token_ids), bias)
    return x[:, :vocab].contiguous()


_apply_logit_bias_op = torch.library.custom_op(
    "deepinfer::apply_logit_bias", _apply_logit_bias_impl, mutates_args=()
)


@_apply_logit_bias_op.register_fake
def _(logits: torch.Tensor, token_ids: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return logits.new_empty(logits.shape, dtype=torch.float32)


def apply_logit_bias(logits: Any, token_ids: Any, bias: Any, *, check_values: bool = True) -> Any:
    """Float32 copy of ``logits`` ``[B, V]`` with ``bias[b, j]`` added to token
    ``token_ids[b, j]`` (``[B, K]``, padded with ``-1``; ``bias`` ``[B, K]``, ``-inf`` bans).

    ``check_values`` (skipped while ``torch.compile`` traces) checks the ids on the host.

    Example::

        # ban token 2 in row 0, favour token 5 by 1.5 in row 1
        out = apply_logit_bias(logits, torch.tensor([[2], [5]]), torch.tensor([[-inf], [1.5]]))
    """
    convert = result_converter(logits)
    x = to_torch(logits, "logits")
    ids = to_torch(token_ids, "token_ids")
    amounts = to_torch(bias, "bias")
    if x.dim() != 2 or not x.is_floating_point():
        raise ValueError("logits: expected a floating 2-d tensor [B, V]")
    if ids.dim() != 2 or ids.shape[0] != x.shape[0]:
        raise ValueError(
            f"token_ids: expected shape [{x.shape[0]}, K] (pad with -1), got {tuple(ids.shape)}"
        )
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise TypeError(f"token_ids: expected an integer tensor, got {ids.dtype}")
    if tuple(amounts.shape) != tuple(ids.shape) or not amounts.is_floating_point():
        raise ValueError(
            f"bias: expected a floating tensor of token_ids' shape {tuple(ids.shape)}, "
            f"got {amounts.dtype} {tuple(amounts.shape)}"
        )
    for name, t in (("token_ids", ids), ("bias", amounts)):
        if t.device != x.device:
            raise ValueError(f"{name}: expected device {x.device}, got {t.device}")
    ids = ids.to(torch.int64)
    if want_value_checks(check_values) and ids.numel() and int(ids.max()) >= x.shape[1]:
        raise ValueError(f"token_ids: ids must be < vocabulary size {x.shape[1]} (pads are -1)")
    result = eager_or_op(_apply_logit_bias_op, _apply_logit_bias_impl)(
        x, ids, amounts.to(torch.float32)
    )
    return convert(result)


def token_bitmask(token_ids: list[int], vocab: int) -> torch.Tensor:
    """int32 ``[ceil(vocab / 32)]`` mask allowing exactly ``token_ids`` (ids ``>= vocab`` or
    ``< 0`` are ignored), in the packed layout of ``apply_token_bitmask``."""
    words = -(-vocab // 32)
    allowed = torch.zeros(words * 32, dtype=torch.int64)
    allowed[[t for t in token_ids if 0 <= t < vocab]] = 1
    packed = (allowed.reshape(words, 32) << torch.arange(32)).sum(dim=1)
    # Bit 31 set means a negative int32: wrap the unsigned word into int32's range.
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
