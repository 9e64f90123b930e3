"""A roofline cost model: each step takes the longer of its compute time and its memory time."""

from __future__ import annotations

import math
import numbers

from deepinfer_sched.costmodel.specs import HardwareSpec, ModelSpec

__all__ = ["RooflineCostModel"]


def _check_fraction(name: str, v: float) -> None:
    if not (0.0 < v <= 1.0):
        raise ValueError(f"{name} must be in (0, 1], got {v}")


def _check_tokens(name: str, v: int) -> None:
    # Fast path for plain ints (the simulator calls this per step); numpy integers also pass.
    if type(v) is int:
        if v < 0:
            raise ValueError(f"{name} must be an int >= 0, got {v!r}")
        return
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
        raise ValueError(f"{name} must be an int >= 0, got {v!r}")


class RooflineCostModel:
    """Roofline timings for one instance of ``num_gpus`` GPUs serving ``model`` on ``hardware``.

    Symbols: ``g`` = num_gpus, ``F`` = peak FLOP/s per GPU, ``W`` = HBM bytes/s per GPU,
    ``P_a`` = active params, ``b_w`` = weight bytes per param, ``b_kv`` = KV bytes per token,
    ``A = 2 L H (d_qk + d_v)`` = attention FLOPs per (query, key) pair over all layers.
    Parallelism is taken as ideal (times divide by ``g``); collective costs are folded into
    ``mfu``/``hbm_efficiency``.
    """

    def __init__(
        self,
        hardware: HardwareSpec,
        model: ModelSpec,
        *,
        num_gpus: int = 1,
        mfu: float = 0.5,
        hbm_efficiency: float = 0.8,
        step_overhead_s: float = 0.002,
    ) -> None:
        if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 1:
            raise ValueError(f"num_gpus must be an int >= 1, got {num_gpus!r}")
        _check_fraction("mfu", mfu)
        _check_fraction("hbm_efficiency", hbm_efficiency)
        if not (step_overhead_s >= 0.0 and math.isfinite(step_overhead_s)):
            raise ValueError(f"step_overhead_s must be finite and >= 0, got {step_overhead_s}")
        self.hardware = hardware
        self.model = model
        self.num_gpus = num_gpus
        self.mfu = mfu
        self.hbm_efficiency = hbm_efficiency
        self.step_overhead_s = step_overhead_s
        self._flops = hardware.peak_flops * mfu * num_gpus
        self._bw = hardware.hbm_bandwidth * hbm_efficiency * num_gpus
        self._attn = (
            2.0
            * model.num_layers
            * model.num_attention_heads
            * (model.qk_head_dim + model.v_head_dim)
        )
        self._kv = model.kv_bytes_per_token

    def __repr__(self) -> str:
        return (
            f"RooflineCostModel({self.hardware.name}, {self.model.name}, "
            f"num_gpus={self.num_gpus}, mfu={self.mfu}, "
            f"hbm_efficiency={self.hbm_efficiency}, step_overhead_s={self.step_overhead_s})"
        )

    @property
    def kv_bytes_per_token(self) -> int:
        """``b_kv``: bytes of KV cache per token (all layers), see ``ModelSpec``."""
        return self._kv

    def weight_bytes(self, batch_size: int = 1) -> float:
        """Weight bytes one forward over ``batch_size`` tokens reads: ``params_touched(B) b_w``."""
        return self.model.params_touched(batch_size) * self.model.weight_bytes_per_param

    def prefill_time(self, new_tokens: int, cached_tokens: int = 0) -> float:
        """Seconds to prefill ``n = new_tokens`` tokens after ``c = cached_tokens`` cached ones.

        ``compute = (2 P_a n + A (n c + n (n + 1) / 2)) / (F mfu g)`` -- the linear layers plus
        causal attention, new token ``i`` attending to ``c + i`` keys (quadratic in length);
        ``memory = (weight_bytes(n) + (c + n) b_kv) / (W eff g)``;
        ``time = max(compute, memory) + overhead``, and 0 when ``n = 0``.
        """
        _check_tokens("new_tokens", new_tokens)
        _check_tokens("cached_tokens", cached_tokens)
        if new_tokens == 0:
            return 0.0
        n = float(new_tokens)
        c = float(cached_tokens)
        flops = 2.0 * self.model.active_params * n + self._attn * (n * c + n * (n + 1.0) / 2.0)
        mem = self.weight_bytes(new_tokens) + (c + n) * self._kv
        return max(flops / self._flops, mem / self._bw) + self.step_overhead_s

    def decode_step_time(self, batch_size: int, total_context_tokens: int) -> float:
        """Seconds of one decode step of ``B = batch_size`` sequences holding
        ``T = total_context_tokens`` KV tokens in all.

        ``memory = (weight_bytes(B) + T b_kv) / (W eff g)`` -- active params for a MoE at
        ``B = 1``, growing towards all experts as ``B`` grows; ``compute = (2 P_a B + A T) /
        (F mfu g)``; ``time = max(memory, compute) + overhead``, and 0 when ``B = 0``.
        """
        _check_tokens("batch_size", batch_size)
        _check_tokens("total_context_tokens", total_context_tokens)
        if batch_size == 0:
            return 0.0
        b = float(batch_size)
        t = float(total_context_tokens)
        mem = self.weight_bytes(batch_size) + t * self._kv
        flops = 2.0 * self.model.active_params * b + self._attn * t
        return max(mem / self._bw, flops / self._flops) + self.step_overhead_s

    def prefill_parts(self, new_tokens: int, cached_tokens: int = 0) -> tuple[float, float]:
        """``(compute, memory)`` seconds of :meth:`prefill_time` before the max and the
        overhead: how long the work would keep the attainable FLOP/s and HBM bandwidth busy."""
        if new_tokens == 0:
            return 0.0, 0.0
        n = float(new_tokens)
        c = float(cached_tokens)
        flops = 2.0 * self.model.active_params * n + self._attn * (n * c + n * (n + 1.0) / 2.0)
        mem = self.weight_bytes(new_tokens) + (c + n) * self._kv
        return flops / self._flops, mem / self._bw

    def decode_parts(self, batch_size: int, total_context_tokens: int) -> tuple[float, float]:
        """``(compute, memory)`` seconds of :meth:`decode_step_time` (see
        :meth:`prefill_parts`)."""
        if batch_size == 0:
            return 0.0, 0.0
        b = float(batch_size)
        t = float(total_context_tokens)
        mem = self.weight_bytes(batch_size) + t * self._kv
        flops = 2.0 * self.model.active_params * b + self._attn * t
        return flops / self._flops, mem / self._bw

    def kv_transfer_time(self, num_tokens: int) -> float:
        """Seconds to move ``N`` tokens of KV to another instance:
        ``link_latency + N b_kv / (link_bandwidth g)`` (each GPU sends its shard over its own
        NIC), 0 when ``N = 0``."""
        _check_tokens("num_tokens", num_tokens)
        if num_tokens == 0:
            return 0.0
        hw = self.hardware
        return hw.link_latency_s + num_tokens * self._kv / (hw.link_bandwidth * self.num_gpus)

    def ssd_fetch_time(self, num_tokens: int) -> float:
        """Seconds to read ``N`` tokens of KV from the shared SSD tier:
        ``ssd_latency + N b_kv / (ssd_bandwidth g)``, 0 when ``N = 0``."""
        _check_tokens("num_tokens", num_tokens)
        if num_tokens == 0:
            return 0.0
        hw = self.hardware
        return hw.ssd_latency_s + num_tokens * self._kv / (hw.ssd_bandwidth * self.num_gpus)

    def kv_capacity_tokens(self, memory_fraction: float = 0.9) -> int:
        """Tokens of KV that fit: ``floor((g HBM fraction - P_total b_w) / b_kv)``.

        Raises ValueError when the weights alone do not fit (use more GPUs per instance).
        """
        _check_fraction("memory_fraction", memory_fraction)
        free = (
            self.hardware.hbm_capacity_bytes * memory_fraction * self.num_gpus
            - self.model.total_params * self.model.weight_bytes_per_param
        )
        tokens = int(free // self._kv)
        if tokens <= 0:
            raise ValueError(
                f"{self.model.name} weights do not fit in {self.num_gpus} x "
                f"{self.hardware.name} at memory_fraction={memory_fraction}; raise num_gpus"
            )
        return tokens
