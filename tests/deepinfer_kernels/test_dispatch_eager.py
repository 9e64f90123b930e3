"""Eager calls run each op's body directly; only ``torch.compile`` traces go through the
registered ``torch.library`` op (whose first eager call would import the compiler stack)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from deepinfer_kernels._dispatch import eager_or_op


def _op(x: int) -> int:
    return x + 1


def _impl(x: int) -> int:
    return x + 2


def test_eager_picks_the_body(monkeypatch: pytest.MonkeyPatch) -> None:
    assert eager_or_op(_op, _impl) is _impl
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert eager_or_op(_op, _impl) is _op


def test_eager_public_ops_do_not_import_the_compiler_stack() -> None:
    code = textwrap.dedent(
        """
        import sys, torch
        import deepinfer_kernels as dk
        i32 = torch.int32
        dk.sample(torch.randn(2, 50), torch.zeros(2), torch.zeros(2, dtype=torch.int64), 1.0)
        ids = torch.zeros(1, 2, dtype=torch.int64)
        dk.greedy_verify(ids, torch.randn(1, 3, 50), torch.tensor([2]))
        dk.speculative_verify(ids, None, torch.softmax(torch.randn(1, 3, 50), -1), torch.tensor([2]))
        cache = torch.randn(4, 4, 2, 8)
        dk.scatter_blocks(cache, torch.tensor([0]), dk.gather_blocks(cache, torch.tensor([1])))
        dk.write_kv(torch.randn(1, 2, 8), torch.randn(1, 2, 8), cache, cache.clone(), torch.tensor([3]))
        o, lse = dk.paged_attention(
            torch.randn(1, 2, 8), cache, cache, torch.tensor([[0, 1]], dtype=i32),
            torch.tensor([5], dtype=i32), torch.tensor([0, 1], dtype=i32), return_lse=True,
        )
        dk.merge_attention_states(o, lse, o, lse)
        dk.paged_decode_attention(
            torch.randn(1, 2, 8), cache, cache, torch.tensor([[0, 1]], dtype=i32),
            torch.tensor([5], dtype=i32),
        )
        from deepinfer_kernels.quant import QuantType, QuantWeight, dequantize_rows, quant_swiglu
        w = QuantWeight(torch.zeros(40, 18, dtype=torch.uint8), QuantType.Q4_0, 32)
        dequantize_rows(w, torch.tensor([1, 2])), dequantize_rows(w, torch.arange(30))
        quant_swiglu(torch.randn(3, 32), w), quant_swiglu(torch.randn(30, 32), w)
        print("torch._dynamo" in sys.modules)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "False", result.stdout + result.stderr
