"""``QuantEmbedding``: lookups through ``dequantize_rows`` and the kept ``table()``, which must
notice every kind of weight change (a new parameter, new ``.data``, an in-place write)."""

from __future__ import annotations

import torch
from torch import nn

from deepinfer.models.quant_layers import QuantEmbedding
from deepinfer_kernels.quant import QuantType, QuantWeight, dequantize, quant_linear
from deepinfer_kernels.testing.quant import random_quant_rows


def _table(seed: int) -> QuantWeight:
    return QuantWeight(random_quant_rows(QuantType.Q4_1, 40, 64, seed=seed), QuantType.Q4_1, 64)


def test_lookup_equals_the_dequantised_tables_rows() -> None:
    table = _table(0)
    emb = QuantEmbedding(table)
    full = dequantize(table)
    for ids in (torch.tensor([7]), torch.tensor([39, 0, 7]), torch.arange(40).view(2, 20)):
        assert torch.equal(emb(ids), full[ids])


def test_table_is_kept_while_current_and_rebuilt_on_any_weight_change() -> None:
    emb = QuantEmbedding(_table(0))
    x = torch.randn(1, 64)
    assert not torch.equal(quant_linear(x, _table(1)), quant_linear(x, _table(0)))
    first = emb.table()
    assert emb.table() is first  # kept: the weight is unchanged

    emb.weight = nn.Parameter(_table(1).data, requires_grad=False)  # a new parameter
    replaced = emb.table()
    assert replaced is not first and replaced.data.data_ptr() == emb.weight.data_ptr()
    assert torch.equal(emb.head_product(x), quant_linear(x, _table(1)))

    emb.weight.data = _table(2).data  # new storage under the same parameter
    assert emb.table() is not replaced
    assert torch.equal(emb(torch.tensor([3])), dequantize(_table(2))[3:4])

    before = emb.table()
    with torch.no_grad():
        emb.weight.copy_(_table(3).data)  # an in-place write: same storage, new version
    after = emb.table()
    assert after is not before
    assert torch.equal(emb.head_product(x), quant_linear(x, _table(3)))
    assert emb.table() is after
