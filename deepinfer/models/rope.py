"""Rotary position embeddings in the Hugging Face (half-split, ``rotate_half``) layout."""

from __future__ import annotations

import math

import torch

from deepinfer.models.config import RopeScaling
from deepinfer.models.int_range import int_range


def inverse_frequencies(
    head_dim: int, theta: float, scaling: RopeScaling | None = None
) -> torch.Tensor:
    """``inv_freq[i] = theta^(-2i/D)`` for ``i < D/2`` (fp32), with optional scaling (Llama-3's
    formula, or llama.cpp's per-frequency divisors)."""
    # Explicit CPU device: independent of any default-device context the caller set.
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv = 1.0 / (theta**exponents)
    if scaling is None:
        return inv
    if scaling.rope_type == "yarn":
        return _yarn_frequencies(inv, head_dim, theta, scaling)
    if scaling.factors is not None:
        # Divide in float64: llama.cpp scales the angle by 1/factor in full precision.
        factors = torch.tensor(scaling.factors, dtype=torch.float64)
        return (inv.double() / factors).float()
    old_len = scaling.original_max_position_embeddings
    low_wavelen = old_len / scaling.low_freq_factor
    high_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    mid = (1 - smooth) * inv / scaling.factor + smooth * inv
    out = torch.where(wavelen > low_wavelen, inv / scaling.factor, inv)
    is_mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_mid, mid, out)


def _yarn_frequencies(
    inv: torch.Tensor, head_dim: int, theta: float, scaling: RopeScaling
) -> torch.Tensor:
    """YaRN: frequencies rotating fewer than ``beta_slow`` times over the original context
    are interpolated (``f/factor``), those rotating more than ``beta_fast`` times kept, with a
    linear ramp between (the dimensions where each count is reached; floored/ceiled when
    ``truncate``), as Hugging Face computes it."""

    def correction_dim(rotations: float) -> float:
        ctx = scaling.original_max_position_embeddings
        return head_dim * math.log(ctx / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(scaling.beta_fast), correction_dim(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # a one-point ramp would divide by zero
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # the share of the original (extrapolated) frequency
    return (inv / scaling.factor) * (1 - keep) + inv * keep


class RotaryEmbedding:
    """Rotates the two halves of each head: for ``x = [x1, x2]`` and angle ``a = pos * inv_freq``,
    ``rope(x) = [x1 cos a - x2 sin a, x2 cos a + x1 sin a]``.

    Angles are computed in fp32 (``inv_freq`` is a plain fp32 tensor, not a module buffer, so
    casting the model to bf16 never degrades it) into a table of positions ``0..N-1`` per
    dtype and device, grown on demand (doubled, up to ``max_position_embeddings``, or to the
    position asked for past it: no hard length bound), and looked up per call. Torch's
    elementwise ``cos``/``sin`` give each element the same bits whatever the tensor's length,
    so a looked-up row equals the direct computation for that position bit for bit
    (``tests/deepinfer/test_model_rope_table.py``); a decode step then pays one index, not
    eight small ops.
    """

    _FIRST_TABLE_ROWS = 256

    def __init__(
        self,
        head_dim: int,
        theta: float,
        scaling: RopeScaling | None = None,
        max_position_embeddings: int | None = None,
    ) -> None:
        self.head_dim = head_dim
        self.max_position_embeddings = max_position_embeddings
        self.inv_freq = inverse_frequencies(head_dim, theta, scaling)
        # YaRN scales cos and sin (the attention temperature); 1 for the other types.
        self.attention_factor = 1.0 if scaling is None else scaling.attention_factor
        # (dtype, device) -> (full_cos, signed_sin), each [N, D] for positions 0..N-1.
        self._tables: dict[tuple[torch.dtype, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Full-width tables ``cos = [cos a, cos a]`` and ``sin = [-sin a, sin a]``, shaped
        ``[*positions.shape, 1, D]`` (broadcast over heads), for :meth:`apply` (new tensors:
        rows copied out of the cached table)."""
        if positions.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"positions must be an integer tensor, got {positions.dtype}")
        low, high = int_range(positions) or (0, 0)
        if low < 0:
            raise ValueError("positions must be >= 0")
        full_cos, signed_sin = self._table(high, dtype, positions.device)
        flat = positions.reshape(-1)
        shape = (*positions.shape, 1, self.head_dim)
        return full_cos[flat].view(shape), signed_sin[flat].view(shape)

    def _table(
        self, position: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached ``(full_cos, signed_sin)`` of ``dtype`` on ``device``, holding at least
        rows ``0..position``."""
        key = (dtype, device)
        table = self._tables.get(key)
        if table is not None and position < table[0].shape[0]:
            return table
        size = self._FIRST_TABLE_ROWS if table is None else 2 * table[0].shape[0]
        if self.max_position_embeddings is not None:
            size = min(size, max(self.max_position_embeddings, self._FIRST_TABLE_ROWS))
        size = max(size, position + 1)
        table = self._compute(torch.arange(size, device=device), dtype)
        self._tables[key] = table
        return table

    def _compute(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(full_cos, signed_sin)`` ``[N, D]`` of the 1-d ``positions``, computed directly."""
        inv = self.inv_freq.to(positions.device)
        angles = positions.float().unsqueeze(-1) * inv
        cos, sin = angles.cos(), angles.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        full_cos = torch.cat((cos, cos), dim=-1).to(dtype)
        signed_sin = torch.cat((-sin, sin), dim=-1).to(dtype)
        return full_cos, signed_sin

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` ``[..., heads, D]`` with the tables of :meth:`cos_sin`:
        ``x * cos + roll(x, D/2) * sin``, i.e. ``[x1 cos - x2 sin, x2 cos + x1 sin]``.

        Three ops instead of the split/concat form's eight: decode steps on CPU pay per op.
        """
        return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin)
