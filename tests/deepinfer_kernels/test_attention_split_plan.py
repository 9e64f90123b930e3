"""The attention plan picks split-K decode for decode-heavy batches (#23 item 2): the choice
from the real lengths, and the split-K output (merged through the log-sum-exp path) against
the reference. Kernels run under the Triton interpreter on CPU, so shapes stay small."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import deepinfer_kernels as dk
from deepinfer_kernels.attention.splits import (
    choose_num_splits,
    compiled_split_count,
    decode_split_count,
)
from deepinfer_kernels.launch_configs import SPLIT_COUNTS
from deepinfer_kernels.reference import paged_attention_reference
from deepinfer_kernels.testing import (
    PagedLayout,
    assert_attention_close,
    materialize,
    paged_attention_cases,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_split_count_from_real_lengths() -> None:
    # Batch-1 decode, 8 KV heads, 32k keys: 33 splits fill the GPU; 32 is compiled.
    assert decode_split_count([1], [32768], 8, 0) == 32
    # The window bounds the keys read: 600 keys give 2 splits of at least 256.
    assert decode_split_count([1], [32768], 8, 600) == 2
    # One long sequence among short ones: the longest real length decides, not the table.
    assert decode_split_count([1, 1], [40, 5000], 8, 0) == compiled_split_count(17) == 16
    # Enough programs already (64 x 8 > 264), or too few keys to split.
    assert decode_split_count([1] * 64, [32768] * 64, 8, 0) == 1
    assert decode_split_count([1], [300], 8, 0) == 1
    # Anything but one query per sequence (a verification, a finished sequence) stays unified.
    assert decode_split_count([1, 2], [32768, 32768], 8, 0) == 1
    assert decode_split_count([1, 0], [32768, 32768], 8, 0) == 1
    assert decode_split_count([], [], 8, 0) == 1


def test_compiled_split_counts_round_down() -> None:
    for n in range(1, 80):
        got = compiled_split_count(n)
        assert got in SPLIT_COUNTS and got <= n
        assert all(s <= got or s > n for s in SPLIT_COUNTS)
    assert choose_num_splits(1, 8, 131072) == 33 and compiled_split_count(33) == 32


def _plan(q_lens, seq_lens, width, **kw):  # type: ignore[no-untyped-def]
    table = torch.arange(len(seq_lens) * width, dtype=torch.int32).view(len(seq_lens), width)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return dk.plan_paged_attention(
        table, torch.tensor(seq_lens, dtype=torch.int32), cu,
        block_size=16, num_q_heads=8, num_kv_heads=8, head_dim=16, **kw,
    )  # fmt: skip


def test_plan_choice() -> None:
    # A long batch-1 decode on the Triton path: split-K with 264 / 8 -> 11 (3000 // 256) -> 8.
    assert _plan([1], [3000], 200, use_triton=True).decode_splits == 8
    # The block table's width is not the length: a wide table with short sequences stays unified.
    assert _plan([1, 1], [20, 30], 4096, use_triton=True).decode_splits == 1
    # A verification row in the batch, the torch path, value checks off: unified.
    assert _plan([1, 3], [3000, 3000], 200, use_triton=True).decode_splits == 1
    assert _plan([1], [3000], 200, use_triton=False).decode_splits == 1
    assert _plan([1], [3000], 200, use_triton=True, check_values=False).decode_splits == 1
    # Forced counts, and what they refuse.
    assert _plan([1], [3000], 200, use_triton=True, split_k=1).decode_splits == 1
    assert _plan([1], [40], 200, use_triton=True, split_k=4).decode_splits == 4
    with pytest.raises(ValueError, match="split_k: split-K decode needs one query"):
        _plan([1, 2], [40, 40], 200, use_triton=True, split_k=4)
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="split_k"):
            _plan([1], [40], 200, use_triton=True, split_k=bad)


def test_forced_split_without_checks_refuses_extra_rows() -> None:
    layout = PagedLayout(
        q_lens=(2,), seq_lens=(20,), block_size=16, num_blocks=2, block_table=((1, 0),),
        num_q_heads=2, num_kv_heads=1, head_dim=16,
    )  # fmt: skip
    case = materialize(layout, device=DEVICE)
    plan = case.plan(use_triton=True, check_values=False, split_k=2)
    with pytest.raises(ValueError, match="q: split-K decode expects one row per sequence"):
        plan.run(case.q, case.k_cache, case.v_cache)


@settings(max_examples=4)
@given(
    case=paged_attention_cases(
        dtypes=(torch.float32, torch.bfloat16), device=DEVICE, kinds=("decode",),
        max_batch=3, max_seq_len=70, allow_non_causal=True,
    ),
    splits=st.sampled_from([2, 4]),
)  # fmt: skip
def test_split_k_plan_matches_reference(case, splits) -> None:  # type: ignore[no-untyped-def]
    plan = case.plan(use_triton=True, split_k=splits)
    assert plan.decode_splits == splits
    out, lse = plan.run(case.q, case.k_cache, case.v_cache, return_lse=True)
    ref_out, ref_lse = paged_attention_reference(*case.tensors(), **case.options(), return_lse=True)
    assert_attention_close(out, ref_out)
    assert_attention_close(lse, ref_lse, dtype=case.q.dtype, what="lse")
    # Same launch as the public split-K op with that count.
    direct = dk.paged_decode_attention(
        *case.tensors()[:5], scale=case.scale, sliding_window=case.sliding_window,
        soft_cap=case.soft_cap, num_splits=splits, use_triton=True,
    )  # fmt: skip
    assert torch.equal(out, direct)


def test_auto_split_runs_and_differentiates() -> None:
    """A 600-key decode next to a short one: the plan picks 2 splits by itself; output, lse and
    the gradient match the reference and the unified launch."""
    layout = PagedLayout(
        q_lens=(1, 1), seq_lens=(600, 30), block_size=16, num_blocks=40,
        block_table=(tuple(range(38)), (39, 38) + (-1,) * 36),
        num_q_heads=2, num_kv_heads=1, head_dim=16,
    )  # fmt: skip
    case = materialize(layout, device=DEVICE, seed=3)
    plan = case.plan(use_triton=True)
    assert plan.decode_splits == 2
    q = case.q.clone().requires_grad_(True)
    out, lse = plan.run(q, case.k_cache, case.v_cache, return_lse=True)
    ref_q = case.q.clone().requires_grad_(True)
    ref_out, ref_lse = paged_attention_reference(
        ref_q, *case.tensors()[1:], **case.options(), return_lse=True
    )
    assert_attention_close(out, ref_out)
    assert_attention_close(lse, ref_lse, what="lse")
    unified = case.plan(use_triton=True, split_k=1).run(case.q, case.k_cache, case.v_cache)
    torch.testing.assert_close(out.detach(), unified, atol=1e-5, rtol=1e-5)
    out.square().sum().backward()
    ref_out.square().sum().backward()
    assert q.grad is not None and ref_q.grad is not None
    torch.testing.assert_close(q.grad, ref_q.grad, atol=1e-4, rtol=1e-4)
