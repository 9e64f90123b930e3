"""``dequantize_rows``: a few rows of a block-format table, bit-identical to dequantising the
whole table (C per-row path up to GEMV_MAX_ROWS ids, gather-then-dequantise past it) and to
the torch reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels.quant import (
    GEMV_MAX_ROWS,
    QuantType,
    QuantWeight,
    dequantize,
    dequantize_rows,
)
from deepinfer_kernels.reference.quant import dequantize_reference
from deepinfer_kernels.testing.quant import quant_weights, random_quant_rows, raw_blocks


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns (NaNs from random scales compare too)."""
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


@settings(max_examples=40, deadline=None)
@given(
    w=st.one_of(quant_weights(max_rows=40), raw_blocks()),
    picks=st.lists(st.integers(0, 10**6), min_size=0, max_size=GEMV_MAX_ROWS + 8),
    wide=st.booleans(),
)
def test_rows_equal_the_whole_tables_rows_and_the_reference(
    w: QuantWeight, picks: list[int], wide: bool
) -> None:
    ids = torch.tensor([p % w.rows for p in picks], dtype=torch.int64 if wide else torch.int32)
    got = dequantize_rows(w, ids)
    assert got.dtype == torch.float32 and got.shape == (len(picks), w.cols)
    assert _same_bits(got, dequantize(w)[ids.long()])
    # The torch reference agrees in value (its NaN payloads may differ from the C kernel's).
    reference = dequantize_reference(w.data, w.qtype)[ids.long()]
    torch.testing.assert_close(got, reference, rtol=0, atol=0, equal_nan=True)


def test_ids_keep_their_shape_and_bad_ids_name_the_argument() -> None:
    w = QuantWeight(random_quant_rows(QuantType.Q4_1, 30, 64, seed=5), QuantType.Q4_1, 64)
    ids = torch.tensor([[1, 29, 0], [4, 4, 7]])
    assert _same_bits(dequantize_rows(w, ids), dequantize(w)[ids])
    for count in (1, GEMV_MAX_ROWS, GEMV_MAX_ROWS + 1):
        for bad in (-1, 30):
            ids = torch.zeros(count, dtype=torch.int64)
            ids[-1] = bad
            with pytest.raises(ValueError, match="ids"):
                dequantize_rows(w, ids)
    with pytest.raises(TypeError, match="ids"):
        dequantize_rows(w, torch.tensor([1.0]))
    with pytest.raises(TypeError, match="weight"):
        dequantize_rows(w.data, torch.tensor([1]))  # type: ignore[arg-type]


def test_op_passes_opcheck_on_both_paths() -> None:
    w = QuantWeight(random_quant_rows(QuantType.Q4_K, 40, 256, seed=6), QuantType.Q4_K, 256)
    op = torch.ops.deepinfer.dequantize_rows.default
    few = torch.tensor([[3, 0], [39, 3]])
    many = torch.arange(GEMV_MAX_ROWS + 4, dtype=torch.int32) * 7 % 40
    for ids in (few, many, torch.zeros(0, dtype=torch.int64)):
        torch.library.opcheck(op, (w.data, ids, int(w.qtype), w.cols))
        assert _same_bits(op(w.data, ids, int(w.qtype), w.cols), dequantize(w)[ids.long()])


def test_compiled_lookup_traces_the_op_and_checks_ids_at_run_time() -> None:
    """A compiled embedding lookup holds the op in one graph (no graph break on the ids'
    values); ids out of range still raise ``ValueError`` naming ``ids`` when it runs."""
    w = QuantWeight(random_quant_rows(QuantType.Q8_0, 30, 64, seed=7), QuantType.Q8_0, 64)
    graphs: list[str] = []

    def backend(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]):  # type: ignore[no-untyped-def]
        graphs.append(str(gm.graph))
        return gm.forward

    compiled = torch.compile(
        lambda ids: dequantize_rows(w, ids) * 2, backend=backend, fullgraph=True
    )
    ids = torch.tensor([4, 29, 0])
    assert _same_bits(compiled(ids), dequantize(w)[ids] * 2)
    assert len(graphs) == 1 and "deepinfer.dequantize_rows" in graphs[0]
    with pytest.raises(ValueError, match="ids"):
        compiled(torch.tensor([4, 30, 0]))
