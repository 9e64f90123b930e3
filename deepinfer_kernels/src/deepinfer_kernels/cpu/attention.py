"""The compiled CPU kernel for short paged-attention tiles (``csrc/paged_attention_tiles.c``).

Plugged into :func:`~deepinfer_kernels.plan_paged_attention` with ``cpu_kernel=``: the plan's
torch path then runs its batches of short tiles (decode and verification rows, up to
``MAX_TILE_Q`` queries per sequence, and short prompts' prefill tiles of up to
``MAX_BATCH_TILE_Q``) on it when ``q`` and the caches are contiguous fp32 CPU
tensors and autograd is off, and keeps the gather + SDPA path otherwise. The maths is the
reference's; results agree to fp32 rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from deepinfer_kernels.cpu.decode_tiles import DecodeTiles
from deepinfer_kernels.cpu.native import NativeFunction
from deepinfer_kernels.cpu.sources import PAGED_ATTENTION_TILES

SOURCE = PAGED_ATTENTION_TILES.path
# Decode and verification tiles: up to this many queries a sequence share batches.
MAX_TILE_Q = 16
# Prefill tiles of up to this many queries (several short prompts in one step) run here too,
# batched by the plan: computing only each row's kept (causal) keys, one call per layer beat one
# SDPA per sequence 1.1-1.5x from 24 to ~100 queries (16 prompts, one core, SmolLM2's heads;
# benchmarks/prefill_attention_ab.py) and lost from ~128 (0.9x at 256).
# Longer tiles stay on SDPA, whose matrix products win there.
MAX_BATCH_TILE_Q = 96


class PagedAttentionTiles:
    """Build-on-first-use handle of the kernel (``enabled=None`` reads
    ``DEEPINFER_CPU_KERNELS``; without a C compiler it is unavailable and warns once).

    Example::

        from deepinfer_kernels import plan_paged_attention
        from deepinfer_kernels.cpu import PagedAttentionTiles

        tiles = PagedAttentionTiles()  # one per engine; reused by every plan
        plan = plan_paged_attention(..., cpu_kernel=tiles)
    """

    def __init__(self, cache_dir: Path | None = None, enabled: bool | None = None) -> None:
        self.fn = NativeFunction(
            PAGED_ATTENTION_TILES,
            "deepinfer_paged_attention_tiles",
            cache_dir=cache_dir,
            enabled=enabled,
        )

    def available(self) -> bool:
        return self.fn.available()

    @staticmethod
    def applies(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, max_q: int) -> bool:
        """Whether a tile batch with these operands can run here: fp32 CPU, contiguous caches,
        ``q`` with contiguous rows (any row stride), autograd off."""
        tensors = (q, k_cache, v_cache)
        return (
            max_q <= MAX_BATCH_TILE_Q
            and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
            and k_cache.is_contiguous()
            and v_cache.is_contiguous()
            and q.dim() == 3
            and q.stride(2) == 1
            and q.stride(1) == q.shape[2]
            and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
        )

    def run(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        *,
        page_ids: torch.Tensor,
        q_rows: torch.Tensor | None,
        row_start: int,
        keep: torch.Tensor | None,
        num_tiles: int,
        max_q: int,
        num_pages: int,
        key_len: int,
        scale: float,
        soft_cap: float,
        want_lse: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(o [num_tiles * max_q, Hq, D], lse [num_tiles * max_q, Hq] or None)`` over the
        padded rows of one planned tile batch (see ``TileBatch``)."""
        hq, d = q.shape[1], q.shape[2]
        rows = num_tiles * max_q
        o = torch.empty(rows, hq, d, dtype=torch.float32)
        lse = torch.empty(rows, hq, dtype=torch.float32) if want_lse else None
        page_ids = page_ids.to(torch.int64).contiguous()
        q_rows = None if q_rows is None else q_rows.to(torch.int64).contiguous()
        keep = None if keep is None else keep.to(torch.bool).contiguous()
        if rows == 0:
            return o, lse
        rc = self.fn(
            *_tile_args(
                q,
                q_rows,
                row_start,
                k_cache,
                v_cache,
                page_ids,
                keep,
                o,
                lse,
                num_tiles,
                max_q,
                num_pages,
                key_len,
                scale,
                soft_cap,
            )
        )
        if rc:
            raise MemoryError("paged_attention_tiles could not allocate its score buffer")
        return o, lse


class BoundTiles:
    """``bound(i)``: :meth:`PagedAttentionTiles.run` of one tile batch whose padded rows are
    exactly ``q``'s rows in order (``row_start`` 0, no ``q_rows``), over layer ``i``'s caches,
    writing ``o`` into ``out`` ``[num_tiles * max_q, Hq, D]`` (contiguous fp32) and no ``lse``:
    one foreign call with arguments built once (``PagedAttentionPlan.bind_cpu_layers`` builds
    it after checking the operands with :meth:`PagedAttentionTiles.applies`).

    For a model that attends with the same batch and buffers in every layer. ``q`` and ``out``
    are read and written in place at every call, so they (and the caches) must keep their
    storage while the runner is used; the runner holds references to all of them.
    """

    def __init__(
        self,
        tiles: PagedAttentionTiles,
        q: torch.Tensor,
        k_caches: Sequence[torch.Tensor],
        v_caches: Sequence[torch.Tensor],
        out: torch.Tensor,
        *,
        page_ids: torch.Tensor,
        keep: torch.Tensor | None,
        num_tiles: int,
        max_q: int,
        num_pages: int,
        key_len: int,
        scale: float,
        soft_cap: float,
    ) -> None:
        hq, d = q.shape[1], q.shape[2]
        rows = num_tiles * max_q
        if (
            out.dtype != torch.float32
            or not out.is_contiguous()
            or tuple(out.shape) != (rows, hq, d)
            or q.shape[0] != rows
        ):
            raise ValueError(
                f"out: expected contiguous fp32 [{rows}, {hq}, {d}] for a q of {rows} rows, "
                f"got {out.dtype} {tuple(out.shape)} and q {tuple(q.shape)}"
            )
        if len(k_caches) != len(v_caches):
            raise ValueError("v_caches: expected one per k_cache")
        pages = page_ids.to(torch.int64).contiguous()
        kept = None if keep is None else keep.to(torch.bool).contiguous()
        # References: the call arguments are these tensors' addresses.
        self._tensors = (q, out, *k_caches, *v_caches)
        self._index = (pages, kept)
        self._fn = tiles.fn
        self._rows, self._max_q = rows, max_q
        self._num_blocks = min((int(k.shape[0]) for k in k_caches), default=0)
        self._args = [
            list(
                _tile_args(
                    q,
                    None,
                    0,
                    k,
                    v,
                    pages,
                    kept,
                    out,
                    None,
                    num_tiles,
                    max_q,
                    num_pages,
                    key_len,
                    scale,
                    soft_cap,
                )
            )
            for k, v in zip(k_caches, v_caches)
        ]

    def __len__(self) -> int:
        return len(self._args)

    def __call__(self, layer: int) -> None:
        if self._rows and self._fn(*self._args[layer]):
            raise MemoryError("paged_attention_tiles could not allocate its score buffer")

    def retarget(self, tiles: DecodeTiles) -> None:
        """Attend over a decode step's tiles (:func:`plan_decode_tiles`; a verification
        tile of ``max_q`` queries from :func:`plan_verify_tile` for a runner bound with that
        ``max_q``) from now on: the
        same ``q``, ``out`` and caches, new pages, mask and key length. A decode step of the
        same batch differs from the last only there, so a model keeps one bound runner per
        batch size and rewrites these five arguments instead of rebuilding every layer's."""
        if tiles.max_q != self._max_q or tiles.num_tiles * tiles.max_q != self._rows:
            raise ValueError(
                f"tiles: expected {self._rows // self._max_q} tiles of {self._max_q} queries "
                f"(this runner's rows), got {tiles.num_tiles} of {tiles.max_q}"
            )
        if tiles.num_blocks > self._num_blocks:
            raise ValueError(
                f"tiles: ids checked against {tiles.num_blocks} blocks, the caches hold "
                f"{self._num_blocks}"
            )
        pages = tiles.page_ids
        keep = tiles.keep
        if pages.dtype != torch.int64 or not pages.is_contiguous():
            raise ValueError("tiles.page_ids: expected contiguous int64")
        if pages.numel() != tiles.num_tiles * tiles.num_pages:
            raise ValueError(f"tiles.page_ids: expected {tiles.num_tiles * tiles.num_pages} ids")
        if keep is not None and (
            keep.dtype != torch.bool
            or not keep.is_contiguous()
            or keep.numel() != tiles.num_tiles * tiles.max_q * tiles.key_len
        ):
            raise ValueError(f"tiles.keep: expected contiguous bool [{tiles.num_tiles}, "
                             f"{tiles.max_q}, {tiles.key_len}]")  # fmt: skip
        self._index = (pages, keep)
        pages_ptr, keep_ptr = pages.data_ptr(), None if keep is None else keep.data_ptr()
        for args in self._args:
            args[_PAGES], args[_KEEP] = pages_ptr, keep_ptr
            args[_NUM_PAGES], args[_KEY_LEN] = tiles.num_pages, tiles.key_len


# Positions in _tile_args of what a decode step changes (BoundTiles.retarget).
_PAGES, _KEEP, _NUM_PAGES, _KEY_LEN = 6, 7, 12, 13


def _tile_args(
    q: torch.Tensor,
    q_rows: torch.Tensor | None,
    row_start: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_ids: torch.Tensor,
    keep: torch.Tensor | None,
    o: torch.Tensor,
    lse: torch.Tensor | None,
    num_tiles: int,
    max_q: int,
    num_pages: int,
    key_len: int,
    scale: float,
    soft_cap: float,
) -> tuple[object, ...]:
    """``deepinfer_paged_attention_tiles``'s arguments (index tensors already int64 / bool and
    contiguous)."""
    _, block_size, hkv, _ = k_cache.shape
    return (
        q.data_ptr(),
        q.stride(0),
        None if q_rows is None else q_rows.data_ptr(),
        row_start,
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        page_ids.data_ptr(),
        None if keep is None else keep.data_ptr(),
        o.data_ptr(),
        None if lse is None else lse.data_ptr(),
        num_tiles,
        max_q,
        num_pages,
        key_len,
        block_size,
        q.shape[1],
        hkv,
        q.shape[2],
        scale,
        soft_cap,
    )
