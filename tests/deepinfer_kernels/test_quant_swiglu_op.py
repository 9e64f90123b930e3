"""``torch.ops.deepinfer.quant_swiglu``: the op behind ``quant_swiglu`` under ``torch.compile``
(the fused AVX-512 pass where it applies, the product then silu and mul elsewhere) against
``quant_swiglu_reference`` on both sides of ``GEMV_MAX_ROWS``; ``opcheck``; a compiled caller
traces it in one graph; the reference itself against the dequantised product."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels.quant import (
    GEMV_MAX_ROWS,
    QuantType,
    QuantWeight,
    dequantize,
    quant_linear,
    quant_swiglu,
)
from deepinfer_kernels.quant.ops import quant_swiglu_impl
from deepinfer_kernels.reference.quant import dequantize_reference, quant_swiglu_reference
from deepinfer_kernels.testing.quant import quant_weights, random_quant_rows, swiglu_tolerance


def _gate_up(w: QuantWeight) -> QuantWeight:
    """Twice ``w``'s rows (the gate, then the up as the gate's rows reversed)."""
    return QuantWeight(torch.cat([w.data, w.data.flip(0)]), w.qtype, w.cols)


def _op(x: torch.Tensor, w: QuantWeight) -> torch.Tensor:
    out: torch.Tensor = torch.ops.deepinfer.quant_swiglu(x, w.data, int(w.qtype), w.cols, False)
    return out


@settings(max_examples=25, deadline=None)
@given(
    w=quant_weights(max_rows=24, max_blocks=2),
    rows=st.sampled_from([1, 4, GEMV_MAX_ROWS, GEMV_MAX_ROWS + 1, 40]),
    lead=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_op_matches_the_reference_on_both_sides_of_the_row_limit(
    w: QuantWeight, rows: int, lead: bool, seed: int
) -> None:
    both = _gate_up(w)
    x = torch.randn(rows, w.cols, generator=torch.Generator().manual_seed(seed))
    got = _op(x.view(1, rows, w.cols) if lead else x, both).reshape(rows, w.rows)
    want = quant_swiglu_reference(x.double(), both.data, both.qtype)
    tol = swiglu_tolerance(x, dequantize(both))
    assert got.dtype == torch.float32
    assert ((got.double() - want).abs() <= tol).all(), (got.double() - want).abs().max()


def test_op_equals_the_public_function_where_that_answers_and_its_fallback_elsewhere() -> None:
    w = _gate_up(
        QuantWeight(random_quant_rows(QuantType.Q4_K, 12, 256, seed=3), QuantType.Q4_K, 256)
    )
    for rows in (3, GEMV_MAX_ROWS + 5):
        x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows))
        fused = quant_swiglu(x, w)
        if fused is None:  # few rows, or no fused path here: the caller's own fallback
            gate, up = quant_linear(x, w).chunk(2, dim=-1)
            fused = F.silu(gate) * up
        assert torch.equal(_op(x, w), fused)


def test_opcheck_on_both_paths_and_a_half_precision_input() -> None:
    w = _gate_up(QuantWeight(random_quant_rows(QuantType.Q8_0, 6, 64, seed=1), QuantType.Q8_0, 64))
    op = torch.ops.deepinfer.quant_swiglu.default
    for x in (torch.randn(3, 64), torch.randn(2, 11, 64), torch.randn(5, 64, dtype=torch.bfloat16)):
        torch.library.opcheck(op, (x, w.data, int(w.qtype), 64, False))
    y = quant_swiglu_impl(torch.randn(5, 64, dtype=torch.bfloat16), w.data, int(w.qtype), 64, False)
    assert y.dtype == torch.bfloat16 and y.shape == (5, 6)


def test_compiled_caller_traces_the_op_in_one_graph() -> None:
    """Under ``torch.compile`` ``quant_swiglu`` answers with the op (never None), for decode
    rows as for prefill rows, and gives the eager caller's values."""
    w = _gate_up(QuantWeight(random_quant_rows(QuantType.Q4_0, 8, 64, seed=2), QuantType.Q4_0, 64))

    def mlp_half(t: torch.Tensor) -> torch.Tensor:
        act = quant_swiglu(t, w)
        if act is None:
            gate, up = quant_linear(t, w).chunk(2, dim=-1)
            act = F.silu(gate) * up
        return act * 2

    graphs: list[str] = []

    def backend(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]):  # type: ignore[no-untyped-def]
        graphs.append(str(gm.graph))
        return gm.forward

    compiled = torch.compile(mlp_half, backend=backend, fullgraph=True, dynamic=False)
    for rows in (2, GEMV_MAX_ROWS + 3):
        x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(rows))
        torch.testing.assert_close(compiled(x), mlp_half(x), rtol=1e-5, atol=1e-5)
    assert len(graphs) == 2 and all("deepinfer.quant_swiglu" in g for g in graphs), graphs
    assert not any("quant_linear" in g for g in graphs)


def test_reference_is_silu_of_the_gate_times_the_up() -> None:
    w = QuantWeight(random_quant_rows(QuantType.Q6_K, 8, 256, seed=4), QuantType.Q6_K, 256)
    x = torch.randn(3, 256)
    gate, up = (x @ dequantize_reference(w.data, w.qtype).t()).chunk(2, dim=-1)
    torch.testing.assert_close(quant_swiglu_reference(x, w.data, w.qtype), F.silu(gate) * up)
    with pytest.raises(ValueError, match="data"):
        quant_swiglu_reference(x, w.data[:7], w.qtype)
