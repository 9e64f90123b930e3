"""``sample`` and ``sampling_probs``: per-request temperature / top-k / top-p / min-p (public ops)."""

from __future__ import annotations

from typing import Any

import torch

from deepinfer_kernels._dispatch import eager_or_op, should_use_triton
from deepinfer_kernels._interop import result_converter, to_torch
from deepinfer_kernels.sampling.params import normalize_params
from deepinfer_kernels.sampling.torch_sampling import sample_torch, sampling_probs_torch
from deepinfer_kernels.verify.validate import want_value_checks


def _sample_impl(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    uniforms: torch.Tensor,
    seed: torch.Tensor,
    use_triton: bool,
) -> torch.Tensor:
    if use_triton:
        from deepinfer_kernels.sampling.triton_sampling import sample_triton

        return sample_triton(logits, temperature, top_k, top_p, min_p, uniforms, seed)
    return sample_torch(logits, temperature, top_k, top_p, min_p, uniforms)


_sample_op = torch.library.custom_op("deepinfer::sample", _sample_impl, mutates_args=())


@_sample_op.register_fake
def _(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    uniforms: torch.Tensor,
    seed: torch.Tensor,
    use_triton: bool,
) -> torch.Tensor:
    return logits.new_empty((logits.shape[0],), dtype=torch.int64)


def sample(
    logits: Any,
    temperature: Any,
    top_k: Any,
    top_p: Any,
    min_p: Any = None,
    *,
    generator: torch.Generator | None = None,
    use_triton: bool | None = None,
    check_values: bool = True,
) -> Any:
    """Draw one token per row of ``logits`` ``[B, V]``; returns int64 ``[B]``.

    Parameters are per request: ``[B]`` tensors (or scalars, broadcast). ``temperature == 0``
    is greedy (the first maximal logit). Otherwise tokens are drawn exactly from
    ``p = softmax(logits / temperature)`` restricted to ``p >= max(t_k, t_p, t_min)`` and
    renormalised, where

    * ``t_k`` = the ``top_k``-th largest ``p`` (``top_k <= 0`` or ``>= V``: disabled);
    * ``t_p`` = the largest ``tau`` with ``sum(p[p >= max(tau, t_k)]) >= top_p *
      sum(p[p >= t_k])`` (``top_p == 1``: disabled), i.e. the smallest top-p nucleus of the
      top-k set;
    * ``t_min`` = ``min_p * max(p)`` (``min_p`` ``None`` or 0: disabled).

    Ties at a threshold are all kept. The torch path draws by inverse CDF in token order with
    one uniform per row from ``generator`` (so a zero-probability token is never returned); the
    Triton kernel draws from the same distribution by rejection (its first round uses that
    uniform, later rounds Philox numbers keyed by one more draw from ``generator``), so the
    two paths agree in distribution, and token for token on rows without top-k / top-p / min-p.
    Invalid values (NaN or +inf logits, a row of only -inf, negative temperature, ``top_p``
    outside ``(0, 1]``, ``min_p`` outside ``[0, 1]``) raise ``ValueError`` when
    ``check_values``. CUDA runs the Triton kernel; ``use_triton`` overrides.
    """
    convert = result_converter(logits)
    x = to_torch(logits, "logits")
    params = normalize_params(x, temperature, top_k, top_p, min_p, want_value_checks(check_values))
    triton = should_use_triton(x.device, use_triton)
    uniforms = torch.rand((x.shape[0],), generator=generator, device=x.device)
    # The kernel's later rejection rounds draw Philox numbers under this key; the torch path
    # needs only the uniforms (and draws nothing more, so its stream is unchanged).
    if triton:
        seed = torch.randint(0, 2**62, (1,), generator=generator, device=x.device)
    else:
        seed = torch.zeros((1,), dtype=torch.int64, device=x.device)
    return convert(eager_or_op(_sample_op, _sample_impl)(x, *params, uniforms, seed, triton))


def sampling_probs(
    logits: Any,
    temperature: Any,
    top_k: Any,
    top_p: Any,
    min_p: Any = None,
    *,
    check_values: bool = True,
) -> Any:
    """The exact ``[B, V]`` float32 distribution ``sample`` draws from (greedy rows: one-hot).

    Use it as ``target_probs`` / ``draft_probs`` of ``speculative_verify`` so that verification
    is lossless with respect to the filtered distribution the user asked for.
    """
    convert = result_converter(logits)
    x = to_torch(logits, "logits")
    params = normalize_params(x, temperature, top_k, top_p, min_p, want_value_checks(check_values))
    return convert(sampling_probs_torch(x, *params))
