"""torch.library registration, torch.compile and DLPack interop of the attention ops."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import deepinfer_kernels as dk
from deepinfer_kernels.attention.ops import (
    merge_attention_states_op,
    paged_attention_op,
    paged_decode_attention_op,
)
from deepinfer_kernels.reference import paged_attention_reference
from deepinfer_kernels.testing import PagedLayout, assert_attention_close, materialize

LAYOUT = PagedLayout(
    q_lens=(1, 4, 2), seq_lens=(9, 6, 2), block_size=4, num_blocks=8,
    block_table=((6, 1, 3), (0, 7, -1), (5, -1, -1)), num_q_heads=4, num_kv_heads=2, head_dim=16,
)  # fmt: skip


def test_ops_are_registered() -> None:
    assert torch.ops.deepinfer.paged_attention.default is not None
    assert torch.ops.deepinfer.paged_decode_attention.default is not None
    assert torch.ops.deepinfer.merge_attention_states.default is not None


def test_opcheck_paged_attention() -> None:
    case = materialize(LAYOUT, seed=0)
    torch.library.opcheck(paged_attention_op, (*case.tensors(), 0.25, True, 5, 0.0, False))
    decode = materialize(
        PagedLayout((1, 1), (9, 3), 4, 8, ((6, 1, 3), (0, -1, -1)), 4, 2, 16), seed=1
    )
    torch.library.opcheck(
        paged_decode_attention_op, (*decode.tensors()[:5], 0.25, -1, 0.0, 2, False)
    )
    o, lse = torch.randn(3, 2, 8), torch.randn(3, 2)
    torch.library.opcheck(merge_attention_states_op, (o, lse, o.clone(), lse.clone(), False))


def test_torch_compile_fullgraph() -> None:
    case = materialize(LAYOUT, seed=2)
    dec = materialize(PagedLayout((1, 1), (9, 3), 4, 8, ((6, 1, 3), (0, -1, -1)), 4, 2, 16), seed=3)

    def step(q, k, v, bt, lens, cu, dq, dk_, dv, dbt, dlens):  # type: ignore[no-untyped-def]
        out, lse = dk.paged_attention(q * 2, k, v, bt, lens, cu, return_lse=True, use_triton=False)
        d_out, d_lse = dk.paged_decode_attention(
            dq, dk_, dv, dbt, dlens, return_lse=True, use_triton=False
        )
        merged, _ = dk.merge_attention_states(d_out, d_lse, d_out, d_lse, use_triton=False)
        return out.sum(-1), lse, merged

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    args = (*case.tensors(), *dec.tensors()[:5])
    out_sum, lse, merged = compiled(*args)
    expected = paged_attention_reference(case.q * 2, *case.tensors()[1:])
    torch.testing.assert_close(out_sum, expected.sum(-1), atol=1e-4, rtol=1e-4)
    eager = dk.paged_decode_attention(*dec.tensors()[:5], use_triton=False)
    assert_attention_close(merged, eager)
    assert lse.shape == case.q.shape[:2]


def test_numpy_arrays_via_dlpack() -> None:
    case = materialize(LAYOUT, seed=4)
    arrays = [t.numpy() for t in case.tensors()]
    out, lse = dk.paged_attention(*arrays, return_lse=True)
    assert isinstance(out, np.ndarray) and isinstance(lse, np.ndarray)
    assert_attention_close(torch.from_numpy(out), paged_attention_reference(*case.tensors()))
    d_out = dk.paged_decode_attention(
        arrays[0][:3], *arrays[1:4], np.array([9, 6, 2], dtype=np.int32)
    )
    assert isinstance(d_out, np.ndarray) and d_out.shape == (3, 4, 16)
    m_out, m_lse = dk.merge_attention_states(out, lse, out, lse)
    assert isinstance(m_out, np.ndarray)
    np.testing.assert_allclose(m_out, out, atol=1e-6)
    np.testing.assert_allclose(m_lse, lse + np.log(2), atol=1e-6)


@pytest.mark.gpu
def test_cupy_arrays_via_dlpack() -> None:
    cp = pytest.importorskip("cupy")
    case = materialize(LAYOUT, seed=5, device="cuda")
    arrays = [cp.from_dlpack(t) for t in case.tensors()]
    out = dk.paged_attention(*arrays)
    assert isinstance(out, cp.ndarray)
    assert_attention_close(torch.from_dlpack(out), paged_attention_reference(*case.tensors()))
    d_out = dk.paged_decode_attention(
        arrays[0][:3], *arrays[1:4], cp.asarray([9, 6, 2], dtype=cp.int32)
    )
    assert isinstance(d_out, cp.ndarray)
