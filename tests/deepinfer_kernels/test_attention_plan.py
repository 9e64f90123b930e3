"""``plan_paged_attention`` / ``PagedAttentionPlan.run``: the plan/run split of paged attention."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import deepinfer_kernels as dk
from deepinfer_kernels.reference import paged_attention_reference
from deepinfer_kernels.testing import (
    PagedLayout,
    assert_attention_close,
    materialize,
    paged_attention_cases,
)


@settings(max_examples=20)
@given(
    case=paged_attention_cases(
        dtypes=(torch.float32, torch.float16, torch.bfloat16),
        allow_non_causal=True,
        kinds=("decode", "verify", "extend"),
    )
)
def test_run_matches_reference_and_the_public_op(case):  # type: ignore[no-untyped-def]
    out, lse = case.plan(use_triton=False).run(case.q, case.k_cache, case.v_cache, return_lse=True)
    ref_out, ref_lse = paged_attention_reference(*case.tensors(), **case.options(), return_lse=True)
    assert out.dtype == case.q.dtype and lse.dtype == torch.float32
    assert_attention_close(out, ref_out)
    assert_attention_close(lse, ref_lse, dtype=case.q.dtype)
    # The public op is plan + run on the torch path: the very same computation.
    op_out, op_lse = dk.paged_attention(
        *case.tensors(), **case.options(), return_lse=True, use_triton=False
    )
    assert torch.equal(out, op_out) and torch.equal(lse, op_lse)


@settings(max_examples=15)
@given(case=paged_attention_cases(max_seq_len=48), layers=st.integers(2, 4))
def test_one_plan_serves_every_layer(case, layers):  # type: ignore[no-untyped-def]
    plan = case.plan()
    for layer in range(layers):
        # Each "layer" has its own cache contents and queries over the same page layout.
        g = torch.Generator().manual_seed(layer)
        k = torch.randn(case.k_cache.shape, generator=g).to(case.k_cache.dtype)
        v = torch.randn(case.v_cache.shape, generator=g).to(case.v_cache.dtype)
        q = torch.randn(case.q.shape, generator=g).to(case.q.dtype)
        here = replace(case, q=q, k_cache=k, v_cache=v)
        out = plan.run(q, k, v)
        assert torch.equal(out, dk.paged_attention(*here.tensors(), **here.options()))
        assert_attention_close(out, paged_attention_reference(*here.tensors(), **here.options()))


@settings(max_examples=15)
@given(
    batch=st.integers(1, 5),
    seq_len=st.integers(1, 40),
    block_size=st.sampled_from([1, 4, 16]),
    gqa=st.sampled_from([1, 3, 4]),
    seed=st.integers(0, 2**16),
)
def test_equal_length_decode_needs_no_mask(batch, seq_len, block_size, gqa, seed):  # type: ignore[no-untyped-def]
    per_seq = -(-seq_len // block_size)
    physical = torch.randperm(batch * per_seq + 2, generator=torch.Generator().manual_seed(seed))
    table = tuple(tuple(physical[b * per_seq : (b + 1) * per_seq].tolist()) for b in range(batch))
    layout = PagedLayout(
        (1,) * batch, (seq_len,) * batch, block_size, batch * per_seq + 2, table, 2 * gqa, 2, 16
    )
    case = materialize(layout, seed=seed)
    plan = case.plan()
    assert not plan.masked and plan.num_tile_batches == 1
    assert_attention_close(
        plan.run(case.q, case.k_cache, case.v_cache), paged_attention_reference(*case.tensors())
    )


def test_mixed_lengths_and_windows_are_masked() -> None:
    layout = PagedLayout((1, 1), (9, 3), 4, 8, ((6, 1, 3), (0, 2, 4)), 4, 2, 16)
    case = materialize(layout, seed=1)
    assert case.plan().masked
    assert replace(case, seq_lens=torch.tensor([9, 9], dtype=torch.int32)).plan().masked is False
    windowed = replace(case, seq_lens=torch.tensor([9, 9], dtype=torch.int32), sliding_window=3)
    assert windowed.plan().masked
    assert_attention_close(
        windowed.plan().run(windowed.q, windowed.k_cache, windowed.v_cache),
        paged_attention_reference(*windowed.tensors(), **windowed.options()),
    )


def test_long_prefill_in_chunks_and_empty_batch() -> None:
    layout = PagedLayout(
        (70, 1), (90, 33), 16, 9, ((4, 0, 7, 2, 8, 1), (3, 6, 5, -1, -1, -1)), 4, 2, 16
    )
    case = materialize(layout, seed=3, sliding_window=40)
    plan = case.plan()
    assert plan.num_tile_batches >= 2
    out = plan.run(case.q, case.k_cache, case.v_cache)
    assert_attention_close(out, paged_attention_reference(*case.tensors(), **case.options()))

    empty = dk.plan_paged_attention(
        torch.zeros((0, 1), dtype=torch.int32),
        torch.zeros(0, dtype=torch.int32),
        torch.zeros(1, dtype=torch.int32),
        block_size=16, num_q_heads=4, num_kv_heads=2, head_dim=16,
    )  # fmt: skip
    o, lse = empty.run(torch.zeros(0, 4, 16), case.k_cache, case.v_cache, return_lse=True)
    assert o.shape == (0, 4, 16) and lse.shape == (0, 4)


LAYOUT = PagedLayout((1, 3), (5, 7), 4, 6, ((2, 5), (0, 4)), 4, 2, 16)


def _i32(values: Any) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def _plan_kwargs() -> dict[str, Any]:
    case = materialize(LAYOUT, seed=0)
    return {
        "block_table": case.block_table,
        "seq_lens": case.seq_lens,
        "cu_seqlens_q": case.cu_seqlens_q,
        "block_size": 4,
        "num_q_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 16,
    }


BAD_METADATA: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("block_table int64", lambda a: a.update(block_table=a["block_table"].long()), "block_table"),
    ("block_table 1-D", lambda a: a.update(block_table=a["block_table"][0]), "block_table"),
    ("negative block id", lambda a: a.update(block_table=_i32([[2, -1], [0, 4]])), "block_table"),
    ("seq_lens shape", lambda a: a.update(seq_lens=_i32([5, 7, 1])), "seq_lens"),
    ("negative seq_len", lambda a: a.update(seq_lens=_i32([-1, 7])), "seq_lens"),
    ("beyond capacity", lambda a: a.update(seq_lens=_i32([9, 7])), "seq_lens"),
    ("cu shape", lambda a: a.update(cu_seqlens_q=_i32([0, 4])), "cu_seqlens_q"),
    ("q_len > seq_len", lambda a: a.update(seq_lens=_i32([5, 2])), "cu_seqlens_q"),
    ("decreasing cu", lambda a: a.update(cu_seqlens_q=_i32([0, 3, 1])), "cu_seqlens_q"),
    ("cu start", lambda a: a.update(cu_seqlens_q=_i32([1, 2, 4])), "cu_seqlens_q"),
    ("block size 3", lambda a: a.update(block_size=3), "block_size"),
    ("block size 0", lambda a: a.update(block_size=0), "block_size"),
    ("heads", lambda a: a.update(num_q_heads=3), "num_q_heads"),
    ("kv heads", lambda a: a.update(num_kv_heads=True), "num_kv_heads"),
    ("head_dim", lambda a: a.update(head_dim=0), "head_dim"),
    ("window", lambda a: a.update(sliding_window=0), "sliding_window"),
    ("soft cap", lambda a: a.update(soft_cap=-1.0), "soft_cap"),
    ("scale", lambda a: a.update(scale=float("nan")), "scale"),
]


@pytest.mark.parametrize(("what", "mutate", "name"), BAD_METADATA, ids=[b[0] for b in BAD_METADATA])
def test_invalid_metadata_names_the_argument(what: str, mutate: Any, name: str) -> None:
    kwargs = _plan_kwargs()
    mutate(kwargs)
    with pytest.raises(ValueError, match=name):
        dk.plan_paged_attention(**kwargs)


def test_causal_must_be_bool() -> None:
    with pytest.raises(TypeError, match="causal"):
        dk.plan_paged_attention(**_plan_kwargs(), causal=1)  # type: ignore[arg-type]


BAD_RUN: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("q rows", lambda a: a.update(q=a["q"][:3]), "q"),
    ("q heads", lambda a: a.update(q=a["q"][:, :2]), "q"),
    ("q dtype", lambda a: a.update(q=a["q"].int()), "q"),
    ("k block size", lambda a: a.update(k_cache=a["k_cache"][:, :2]), "k_cache"),
    ("k dtype", lambda a: a.update(k_cache=a["k_cache"].half()), "k_cache"),
    ("v pool", lambda a: a.update(v_cache=a["v_cache"][:5]), "v_cache"),
    ("pool too small", lambda a: a.update(k_cache=a["k_cache"][:5], v_cache=a["v_cache"][:5]),
     "block_table"),
    ("not a tensor", lambda a: a.update(k_cache=[1.0]), "k_cache"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "mutate", "name"), BAD_RUN, ids=[b[0] for b in BAD_RUN])
def test_invalid_run_inputs_name_the_argument(what: str, mutate: Any, name: str) -> None:
    case = materialize(LAYOUT, seed=0)
    plan = case.plan()
    args = {"q": case.q, "k_cache": case.k_cache, "v_cache": case.v_cache}
    mutate(args)
    with pytest.raises((ValueError, TypeError), match=name):
        plan.run(args["q"], args["k_cache"], args["v_cache"])


def test_numpy_arrays_answer_in_kind() -> None:
    case = materialize(LAYOUT, seed=5)
    plan = dk.plan_paged_attention(
        case.block_table.numpy(), case.seq_lens.numpy(), case.cu_seqlens_q.numpy(),
        block_size=4, num_q_heads=4, num_kv_heads=2, head_dim=16,
    )  # fmt: skip
    out, lse = plan.run(case.q.numpy(), case.k_cache.numpy(), case.v_cache.numpy(), return_lse=True)
    assert isinstance(out, np.ndarray) and isinstance(lse, np.ndarray)
    assert_attention_close(torch.from_numpy(out), paged_attention_reference(*case.tensors()))


def test_triton_plan_runs_the_kernel() -> None:
    """On the Triton path (here under the interpreter) ``run`` calls the kernel."""
    case = materialize(LAYOUT, seed=6, soft_cap=5.0)
    plan = case.plan(use_triton=True, check_values=False)
    assert plan.use_triton and plan.total_q is None
    out = plan.run(case.q, case.k_cache, case.v_cache)
    assert_attention_close(out, paged_attention_reference(*case.tensors(), **case.options()))


@settings(max_examples=10)
@given(
    q_lens=st.lists(st.integers(1, 20), min_size=1, max_size=3),
    extra=st.integers(0, 9),
    block_size=st.sampled_from([1, 4, 16]),
    strided_pool=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_consecutive_pages_are_read_without_a_gather(q_lens, extra, block_size, strided_pool, seed):  # type: ignore[no-untyped-def]
    """Blocks allocated in order (one run of ids) are read as a slice of the pool: same result,
    also when the pool is a strided view."""
    seq_lens = [m + extra for m in q_lens]
    used = [-(-n // block_size) for n in seq_lens]
    width, rows, at = max(used), [], 2
    for u in used:
        rows.append(tuple(range(at, at + u)) + (-1,) * (width - u))
        at += u
    layout = PagedLayout(tuple(q_lens), tuple(seq_lens), block_size, at + 1, tuple(rows), 4, 2, 16)
    case = materialize(layout, seed=seed)
    if strided_pool:
        big_k = torch.zeros((at + 1) * 2, block_size, 2, 16)
        big_v = torch.zeros_like(big_k)
        big_k[::2], big_v[::2] = case.k_cache, case.v_cache
        case = replace(case, k_cache=big_k[::2], v_cache=big_v[::2])
    out = case.plan().run(case.q, case.k_cache, case.v_cache)
    assert_attention_close(out, paged_attention_reference(*case.tensors(), **case.options()))


@settings(max_examples=8, deadline=None)
@given(
    prefix_q_len=st.sampled_from([(0, 512), (0, 700), (1, 1024), (300, 1030)]),
    block_size=st.sampled_from([4, 16]),
    gqa=st.sampled_from([1, 3]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_long_prefill_chunks_run_the_causal_kernel(prefix_q_len, block_size, gqa, dtype, seed):  # type: ignore[no-untyped-def]
    """A lone prefill chunk of >= 512 queries (>= 1024 after a cached prefix) runs the flash
    kernel's causal mode, the prefix in a second call merged through the LSEs, with no
    additive mask built; ``o`` and ``lse`` equal the reference's."""
    prefix, q_len = prefix_q_len
    seq_len = prefix + q_len
    pages = -(-seq_len // block_size)
    physical = torch.randperm(pages + 3, generator=torch.Generator().manual_seed(seed))
    layout = PagedLayout(
        (q_len,), (seq_len,), block_size, pages + 3, (tuple(physical[:pages].tolist()),),
        2 * gqa, 2, 32,
    )  # fmt: skip
    case = materialize(layout, dtype=dtype, seed=seed)
    plan = case.plan(use_triton=False)
    (tb,) = plan._batches
    assert tb.causal_from == prefix and tb.bias is None and plan.masked
    out, lse = plan.run(case.q, case.k_cache, case.v_cache, return_lse=True)
    ref_out, ref_lse = paged_attention_reference(*case.tensors(), return_lse=True)
    assert_attention_close(out, ref_out)
    assert_attention_close(lse, ref_lse, dtype=torch.float32)


def test_windowed_or_short_chunks_keep_the_additive_mask() -> None:
    layout = PagedLayout((600,), (600,), 16, 40, (tuple(range(38)),), 4, 2, 16)
    case = materialize(layout, seed=3)
    windowed = replace(case, sliding_window=100)
    (tb,) = windowed.plan(use_triton=False)._batches
    assert tb.causal_from is None and tb.bias is not None
    assert_attention_close(
        windowed.plan(use_triton=False).run(windowed.q, windowed.k_cache, windowed.v_cache),
        paged_attention_reference(*windowed.tensors(), **windowed.options()),
    )
    short = materialize(PagedLayout((100,), (100,), 16, 8, (tuple(range(7)),), 4, 2, 16), seed=4)
    (tb,) = short.plan(use_triton=False)._batches
    assert tb.causal_from is None and tb.bias is not None
    # 600 queries after 300 cached keys: the merge would not pay, the mask stays.
    after = materialize(PagedLayout((600,), (900,), 16, 60, (tuple(range(57)),), 4, 2, 16), seed=5)
    (tb,) = after.plan(use_triton=False)._batches
    assert tb.causal_from is None and tb.bias is not None


@pytest.mark.parametrize("prefix", [0, 300])
def test_causal_prefill_past_the_score_budget_is_one_tile(
    prefix: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The causal mode materialises no scores, so a long prefill chunk runs as one causal tile
    whatever the score budget (cut into budget-sized chunks, the later ones ran an additive mask
    over every earlier key); with a soft cap the manual path materialises them and the budget
    still cuts the chunk. Both equal the reference."""
    from deepinfer_kernels.attention import tile_plan

    monkeypatch.setattr(tile_plan, "_SCORE_BUDGET", 1 << 16)  # 4 heads x 1324 keys: chunks of 12
    q_len = 1024
    pages = -(-(prefix + q_len) // 16)
    layout = PagedLayout(
        (q_len,), (prefix + q_len,), 16, pages + 2, (tuple(range(pages)),), 4, 2, 16
    )
    case = materialize(layout, seed=7)
    plan = case.plan(use_triton=False)
    (tb,) = plan._batches
    assert tb.causal_from == prefix and tb.num_rows == q_len and tb.bias is None
    ref = paged_attention_reference(*case.tensors(), **case.options())
    assert_attention_close(plan.run(case.q, case.k_cache, case.v_cache), ref)

    capped = replace(case, soft_cap=5.0)
    plan = capped.plan(use_triton=False)
    assert plan.num_tile_batches > 1
    assert all(tb.causal_from is None for tb in plan._batches)
    ref = paged_attention_reference(*capped.tensors(), **capped.options())
    assert_attention_close(plan.run(capped.q, capped.k_cache, capped.v_cache), ref)
