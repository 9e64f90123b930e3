"""``linear(x, w, b) = x W^T + b``, choosing the faster of two equal products on CPU.

For a handful of rows (a decode batch, a speculative verification, a short prefill chunk),
MKL's fp32 ``x @ W^T`` with a row-major ``W`` ``[out, in]`` runs a kernel that is 2-3x slower
than the mathematically identical ``(W @ x^T)^T``: on the 2-core AVX-512 machine we measured
the 121 SmolLM2 projections of a 16-row step in 143 ms vs 78 ms, with a cross-over at 4 rows
below and about 64 rows above (``benchmarks/model_runner_linear.py`` prints the sweep). Keeping
the weights in their usual layout means no second copy and unchanged state dicts; only the
product order changes, so results agree with ``F.linear`` to fp32 rounding (not bitwise).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Row counts for which ``W @ x^T`` wins on CPU (measured; see the module docstring).
CPU_TRANSPOSED_ROWS = range(4, 49)


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    contiguous: bool = True,
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for ``x`` ``[..., in]``, ``weight`` ``[out, in]``.

    ``contiguous=False``: for 2-d ``x`` the result may be the transposed view of ``W x^T``
    (no copy). Element-wise consumers and a following ``linear`` take it as it is (its
    transpose is then the contiguous operand the next product wants); the SwiGLU block runs
    about 5% faster per 8-16 row step that way.
    """
    if x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32:
        return F.linear(x, weight, bias)
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if rows not in CPU_TRANSPOSED_ROWS:
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])
    out = torch.mm(weight, flat.t()).t()
    if bias is not None:
        out = out + bias
    if not contiguous and x.dim() == 2:
        return out
    # Contiguous so that callers can ``view`` the result as with ``F.linear``.
    return out.contiguous().view(*x.shape[:-1], weight.shape[0])
