"""Hypothesis strategies and assertions for testing paged-attention kernels.

Other engines can test their own kernels against our reference with these::

    from hypothesis import given
    from deepinfer_kernels.reference import paged_attention_reference
    from deepinfer_kernels.testing import assert_attention_close, paged_attention_cases

    @given(paged_attention_cases())
    def test_my_kernel(case):
        expected = paged_attention_reference(*case.tensors(), **case.options())
        assert_attention_close(my_kernel(*case.tensors(), **case.options()), expected)

Layouts are drawn the way a real engine produces them: physical blocks are a shuffled,
non-contiguous subset of a larger pool, unused block-table entries hold ``-1`` (a kernel that
reads them is wrong), and one batch mixes decode (``q_len = 1``), speculative verification
(``q_len = 2..6``) and extend (a cached prefix plus new tokens, possibly no prefix at all).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from hypothesis import strategies as st

from deepinfer_kernels.attention import PagedAttentionPlan, plan_paged_attention

# (atol, rtol) against the fp32 reference, per input dtype.
ATTENTION_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (5e-3, 5e-3),
    torch.bfloat16: (3e-2, 3e-2),
}

KINDS = ("decode", "verify", "extend")
# A sequence whose KV is cached but which has no query in this batch (q_len = 0).
EMPTY = "empty"

# Sizes per profile. "thorough" reaches past every kernel's tiles (64-key tiles, 128-row query
# tiles, split-K chunks): a tiled online softmax that forgets to rescale its accumulator only
# shows once a row spans several key tiles. "quick" keeps a suite on the Triton interpreter
# fast. Arguments passed explicitly always win over the profile.
PROFILES: dict[str, dict[str, Any]] = {
    "quick": {
        "max_batch": 4,
        "max_seq_len": 40,
        "kinds": KINDS,
        "block_sizes": (1, 4, 16),
        "head_dims": (16, 32, 64),
        "max_window": 24,
    },
    "thorough": {
        "max_batch": 4,
        "max_seq_len": 320,
        "kinds": (*KINDS, EMPTY),
        "block_sizes": (1, 4, 16, 32, 64),
        "head_dims": (16, 32, 64, 80, 96, 128, 192, 256),
        "max_window": 300,
    },
}
PROFILE_ENV = "DEEPINFER_TESTING_PROFILE"


def resolve_profile(profile: str | None) -> dict[str, Any]:
    """The sizes of ``profile``; ``None`` reads ``$DEEPINFER_TESTING_PROFILE`` (default
    ``"thorough"``), so a repository can keep its own suite on quick sizes in one place."""
    name = os.environ.get(PROFILE_ENV, "thorough") if profile is None else profile
    if name not in PROFILES:
        raise ValueError(f"profile: expected one of {sorted(PROFILES)}, got {name!r}")
    return PROFILES[name]


@dataclass(frozen=True)
class PagedLayout:
    """Sizes and page placement of one batch (plain ints, no tensors)."""

    q_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]
    block_size: int
    num_blocks: int
    block_table: tuple[tuple[int, ...], ...]  # rows padded with -1
    num_q_heads: int
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class PagedAttentionCase:
    """Materialised inputs and options of one paged-attention call."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor
    scale: float | None = None
    causal: bool = True
    sliding_window: int | None = None
    soft_cap: float | None = None
    layout: PagedLayout | None = field(default=None, compare=False)
    seed: int | None = field(default=None, compare=False)

    def __repr__(self) -> str:
        """Layout, shapes, dtype, options and seed: enough to rebuild the case with
        :func:`materialize`, never the tensors themselves (hypothesis prints this on failure)."""
        return (
            f"PagedAttentionCase(layout={self.layout!r}, dtype={self.q.dtype}, "
            f"device={self.q.device}, seed={self.seed}, q={tuple(self.q.shape)}, "
            f"k_cache={tuple(self.k_cache.shape)}, scale={self.scale}, causal={self.causal}, "
            f"sliding_window={self.sliding_window}, soft_cap={self.soft_cap})"
        )

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """Positional arguments of ``paged_attention``."""
        return (
            self.q,
            self.k_cache,
            self.v_cache,
            self.block_table,
            self.seq_lens,
            self.cu_seqlens_q,
        )

    def options(self) -> dict[str, Any]:
        """Keyword options of ``paged_attention``."""
        return {
            "scale": self.scale,
            "causal": self.causal,
            "sliding_window": self.sliding_window,
            "soft_cap": self.soft_cap,
        }

    def plan(self, **extra: Any) -> PagedAttentionPlan:
        """``plan_paged_attention`` for this case's metadata and options (``extra``: more
        keyword arguments, e.g. ``use_triton`` or ``cpu_kernel``)."""
        _, hq, d = self.q.shape
        return plan_paged_attention(
            self.block_table,
            self.seq_lens,
            self.cu_seqlens_q,
            block_size=self.k_cache.shape[1],
            num_q_heads=hq,
            num_kv_heads=self.k_cache.shape[2],
            head_dim=d,
            **self.options(),
            **extra,
        )

    def with_shuffled_blocks(self, seed: int) -> PagedAttentionCase:
        """Same logical content, physical blocks permuted (the table follows them)."""
        g = torch.Generator().manual_seed(seed)
        perm = torch.randperm(self.k_cache.shape[0], generator=g).to(self.k_cache.device)
        new_slot = torch.empty_like(perm)
        new_slot[perm] = torch.arange(perm.numel(), device=perm.device)
        table = self.block_table.long()
        moved = torch.where(table >= 0, new_slot[table.clamp_min(0)], table)
        return replace(
            self,
            k_cache=self.k_cache[perm],
            v_cache=self.v_cache[perm],
            block_table=moved.to(torch.int32),
        )


def _draw_lengths(draw: st.DrawFn, kind: str, max_seq_len: int) -> tuple[int, int]:
    if kind == EMPTY:
        return 0, draw(st.integers(0, max_seq_len))
    if kind == "decode":
        n = draw(st.integers(1, max_seq_len))
        return 1, n
    if kind == "verify":
        m = draw(st.integers(2, min(6, max_seq_len)))
        return m, draw(st.integers(m, max_seq_len))
    m = draw(st.integers(1, max_seq_len))
    prefix = draw(st.integers(0, max_seq_len - m))
    return m, m + prefix


@st.composite
def paged_layouts(
    draw: st.DrawFn,
    /,
    *,
    profile: str | None = None,
    max_batch: int | None = None,
    max_seq_len: int | None = None,
    kinds: Sequence[str] | None = None,
    block_sizes: Sequence[int] | None = None,
    head_dims: Sequence[int] | None = None,
    gqa_ratios: Sequence[int] = (1, 4, 8),
    num_kv_heads: Sequence[int] = (1, 2),
    spare_blocks: int = 3,
) -> PagedLayout:
    """Draw a valid, shuffled paged layout for a ragged batch.

    ``kinds`` chooses each sequence's query pattern among ``"decode"`` (1 query),
    ``"verify"`` (2..6 queries), ``"extend"`` (any number of new tokens over a cached
    prefix of any length) and ``"empty"`` (cached KV, no query this step). ``gqa_ratios`` is
    ``Hq / Hkv`` (1 = MHA; MQA when ``Hkv = 1``). Sizes left ``None`` come from ``profile``
    (see :data:`PROFILES`; ``None`` = ``$DEEPINFER_TESTING_PROFILE`` or ``"thorough"``).
    """
    sizes = resolve_profile(profile)
    max_batch = sizes["max_batch"] if max_batch is None else max_batch
    max_seq_len = sizes["max_seq_len"] if max_seq_len is None else max_seq_len
    kinds = sizes["kinds"] if kinds is None else kinds
    block_sizes = sizes["block_sizes"] if block_sizes is None else block_sizes
    head_dims = sizes["head_dims"] if head_dims is None else head_dims
    for kind in kinds:
        if kind not in (*KINDS, EMPTY):
            raise ValueError(f"kinds: unknown kind {kind!r}, expected one of {(*KINDS, EMPTY)}")
    batch = draw(st.integers(1, max_batch))
    lengths = [_draw_lengths(draw, draw(st.sampled_from(kinds)), max_seq_len) for _ in range(batch)]
    block_size = draw(st.sampled_from(block_sizes))
    hkv = draw(st.sampled_from(num_kv_heads))
    hq = hkv * draw(st.sampled_from(gqa_ratios))
    head_dim = draw(st.sampled_from(head_dims))
    used = [-(-n // block_size) for _, n in lengths]
    max_blocks = max(max(used) + draw(st.integers(0, 1)), 1)
    num_blocks = sum(used) + draw(st.integers(0, spare_blocks))
    physical = draw(st.permutations(range(num_blocks)))
    rows, at = [], 0
    for u in used:
        rows.append(tuple(physical[at : at + u]) + (-1,) * (max_blocks - u))
        at += u
    return PagedLayout(
        q_lens=tuple(m for m, _ in lengths),
        seq_lens=tuple(n for _, n in lengths),
        block_size=block_size,
        num_blocks=num_blocks,
        block_table=tuple(rows),
        num_q_heads=hq,
        num_kv_heads=hkv,
        head_dim=head_dim,
    )


def materialize(
    layout: PagedLayout,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    **options: Any,
) -> PagedAttentionCase:
    """Random tensors (standard normal, fixed ``seed``) for ``layout``."""
    g = torch.Generator().manual_seed(seed)
    cache_shape = (layout.num_blocks, layout.block_size, layout.num_kv_heads, layout.head_dim)
    total_q = sum(layout.q_lens)
    cu = [0]
    for m in layout.q_lens:
        cu.append(cu[-1] + m)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    def ints(values: Any) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    return PagedAttentionCase(
        q=rand(total_q, layout.num_q_heads, layout.head_dim),
        k_cache=rand(*cache_shape),
        v_cache=rand(*cache_shape),
        block_table=ints(layout.block_table),
        seq_lens=ints(layout.seq_lens),
        cu_seqlens_q=ints(cu),
        layout=layout,
        seed=seed,
        **options,
    )


@st.composite
def paged_attention_cases(
    draw: st.DrawFn,
    /,
    *,
    dtypes: Sequence[torch.dtype] = (torch.float32,),
    device: str | torch.device = "cpu",
    allow_window: bool = True,
    allow_soft_cap: bool = True,
    allow_non_causal: bool = False,
    profile: str | None = None,
    **layout_options: Any,
) -> PagedAttentionCase:
    """Draw a layout (see :func:`paged_layouts`, which takes ``profile`` and
    ``layout_options``), options (window up to the profile's ``max_window``, soft cap,
    explicit scale, causal) and materialise random tensors."""
    layout = draw(paged_layouts(profile=profile, **layout_options))
    max_window = resolve_profile(profile)["max_window"]
    window = st.one_of(st.none(), st.integers(1, max_window))
    options: dict[str, Any] = {
        "scale": draw(st.sampled_from([None, 0.5])),
        "causal": draw(st.booleans()) if allow_non_causal else True,
        "sliding_window": draw(window) if allow_window else None,
        "soft_cap": draw(st.sampled_from([None, 5.0])) if allow_soft_cap else None,
    }
    return materialize(
        layout,
        dtype=draw(st.sampled_from(dtypes)),
        device=device,
        seed=draw(st.integers(0, 2**16)),
        **options,
    )


def assert_attention_close(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    dtype: torch.dtype | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    what: str = "attention output",
) -> None:
    """Assert ``actual`` matches ``expected`` within the tolerance of the input dtype.

    ``dtype`` defaults to ``actual.dtype`` (pass the input dtype when comparing fp32 values
    such as ``lse`` computed from low-precision inputs). Tolerances come from
    :data:`ATTENTION_TOLERANCES` unless ``atol``/``rtol`` are given. ``-inf`` entries must
    match exactly.
    """
    dtype = actual.dtype if dtype is None else dtype
    if dtype not in ATTENTION_TOLERANCES:
        raise ValueError(f"dtype: no tolerance for {dtype}, expected one of fp32/fp16/bf16")
    d_atol, d_rtol = ATTENTION_TOLERANCES[dtype]
    if tuple(actual.shape) != tuple(expected.shape):
        raise AssertionError(f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}")
    torch.testing.assert_close(
        actual.float().cpu(),
        expected.float().cpu(),
        atol=d_atol if atol is None else atol,
        rtol=d_rtol if rtol is None else rtol,
        msg=lambda m: f"{what} ({dtype}): {m}",
    )
