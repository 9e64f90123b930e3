"""``QuantLinear.runs``: neighbouring parts of one format are one product (many-row steps)."""

from __future__ import annotations

import pytest
import torch
from quant_helpers import block_bytes

from deepinfer.models.quant_layers import QuantLinear
from deepinfer_kernels.quant import QuantType, QuantWeight

COLS = 256


def _part(qtype: str, rows: int, seed: int) -> QuantWeight:
    data = torch.from_numpy(block_bytes(qtype, rows, COLS, 0.05, seed).copy())
    return QuantWeight(data, QuantType[qtype], COLS)


def test_runs_join_neighbours_of_one_format_as_views() -> None:
    layout = [("Q4_1", 8), ("Q4_1", 4), ("Q8_0", 4), ("Q4_1", 4), ("Q4_K", 4), ("Q4_K", 8)]
    lin = QuantLinear([_part(q, r, i) for i, (q, r) in enumerate(layout)])
    runs = lin.runs()
    want = [(QuantType.Q4_1, 12), (QuantType.Q8_0, 4), (QuantType.Q4_1, 4), (QuantType.Q4_K, 12)]
    assert [(r.qtype, r.rows) for r in runs] == want
    base = lin.weight.data_ptr()
    offsets = [r.data.data_ptr() - base for r in runs]
    sizes = [r.data.numel() for r in runs]
    assert offsets == [sum(sizes[:i]) for i in range(len(runs))]  # views, in order, no copy
    assert sum(sizes) == lin.weight.numel()
    dense = torch.cat([p.data.reshape(-1) for p in lin.parts()])
    assert torch.equal(torch.cat([r.data.reshape(-1) for r in runs]), dense)


@pytest.mark.parametrize("rows", [3, 17, 40])
@pytest.mark.parametrize("bias", [False, True])
def test_forward_over_runs_equals_the_dequantised_product(rows: int, bias: bool) -> None:
    layout = [("Q4_1", 12), ("Q4_1", 4), ("Q6_K", 8), ("Q4_1", 4)]
    parts = [_part(q, r, 10 + i) for i, (q, r) in enumerate(layout)]
    b = torch.randn(28) if bias else None
    lin = QuantLinear(parts, b)
    x = torch.randn(rows, COLS, generator=torch.Generator().manual_seed(rows))
    want = x.double() @ lin.dequantized().double().t()
    if b is not None:
        want = want + b.double()
    got = lin(x)
    assert got.shape == (rows, 28) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
