"""``plan_write_kv``: validate a step's slot mapping once, then write every layer's K/V cheaply.

A decoder writes the same slots into each of its layers' caches. :func:`write_kv` re-checks the
arguments and re-scans the slot ids on every call; for a one-token decode step on CPU those
checks cost more than the copy itself, 30+ times per step. A :class:`WriteKVPlan` does the
value checks once (range, duplicates) and remembers whether every slot is written, so
:meth:`WriteKVPlan.run` is the copy plus a few shape comparisons.
"""

from __future__ import annotations

from typing import Any

import torch

from deepinfer_kernels._dispatch import should_use_triton
from deepinfer_kernels._interop import to_torch
from deepinfer_kernels.kv.validate import check_slot_values
from deepinfer_kernels.kv.write import _slot_view, copy_rows, write_kv
from deepinfer_kernels.verify.validate import check_int_tensor


class WriteKVPlan:
    """The checked slot mapping of one step; :meth:`run` writes one layer's K/V.

    Build it with :func:`plan_write_kv`. ``run(k, v, k_cache, v_cache)`` has the semantics of
    ``write_kv(k, v, k_cache, v_cache, slot_mapping)`` for caches with the planned
    ``[num_blocks, block_size, ...]`` leading dims.
    """

    def __init__(
        self,
        slot_mapping: torch.Tensor,
        slots: torch.Tensor,
        all_written: bool,
        num_blocks: int,
        block_size: int,
        use_triton: bool,
    ) -> None:
        self.slot_mapping = slot_mapping
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.use_triton = use_triton
        self._slots = slots  # int64 copy of the mapping
        self._all_written = all_written  # no -1: one index_copy_ per cache

    @property
    def num_tokens(self) -> int:
        return int(self._slots.shape[0])

    def run(self, k: Any, v: Any, k_cache: Any, v_cache: Any) -> None:
        """Write ``k``, ``v`` ``[T, ...]`` into ``k_cache``, ``v_cache`` at the planned slots."""
        k_t, v_t = to_torch(k, "k"), to_torch(v, "v")
        kc, vc = to_torch(k_cache, "k_cache"), to_torch(v_cache, "v_cache")
        lead = (self.num_blocks, self.block_size)
        if tuple(kc.shape[:2]) != lead or tuple(vc.shape[:2]) != lead:
            raise ValueError(
                f"k_cache/v_cache: expected leading dims {lead} (the plan's), got "
                f"{tuple(kc.shape)} and {tuple(vc.shape)}"
            )
        n = self.num_tokens
        if k_t.shape[0] != n or v_t.shape[0] != n:
            raise ValueError(
                f"k/v: expected {n} rows (the plan's tokens), got {k_t.shape[0]} and {v_t.shape[0]}"
            )
        if self.use_triton or not self._all_written or torch.compiler.is_compiling():
            # Masked writes, CUDA and traced calls take the general op (values already checked).
            write_kv(
                k_t, v_t, kc, vc, self.slot_mapping, use_triton=self.use_triton, check_values=False
            )
            return
        k_flat, v_flat = _slot_view(kc), _slot_view(vc)
        if k_flat is None or v_flat is None:
            write_kv(k_t, v_t, kc, vc, self.slot_mapping, use_triton=False, check_values=False)
            return
        if tuple(k_t.shape[1:]) != tuple(k_flat.shape[1:]) or tuple(v_t.shape[1:]) != tuple(
            v_flat.shape[1:]
        ):
            raise ValueError(
                f"k/v: expected trailing dims {tuple(k_flat.shape[1:])} and "
                f"{tuple(v_flat.shape[1:])}, got {tuple(k_t.shape)} and {tuple(v_t.shape)}"
            )
        copy_rows(k_t, v_t, k_flat, v_flat, self._slots)


def plan_write_kv(
    slot_mapping: Any,
    *,
    num_blocks: int,
    block_size: int,
    use_triton: bool | None = None,
) -> WriteKVPlan:
    """Check ``slot_mapping`` ``[T]`` (``block * block_size + offset``, -1 = skip) once for
    caches of ``num_blocks`` x ``block_size`` slots: every entry -1 or in range, no slot twice
    (``ValueError`` otherwise). Reads the ids (a sync on CUDA), like ``write_kv`` with
    ``check_values=True``.

    Example::

        plan = plan_write_kv(slot_mapping, num_blocks=kc.shape[0], block_size=kc.shape[1])
        for layer in range(num_layers):
            plan.run(k[layer], v[layer], k_caches[layer], v_caches[layer])
    """
    for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name}: expected a positive int, got {value!r}")
    s = to_torch(slot_mapping, "slot_mapping")
    check_int_tensor(s, "slot_mapping", 1)
    check_slot_values(s, num_blocks * block_size)
    slots = s.to(torch.int64)
    all_written = bool((slots >= 0).all()) if slots.numel() else True
    return WriteKVPlan(
        s, slots, all_written, num_blocks, block_size, should_use_triton(s.device, use_triton)
    )
