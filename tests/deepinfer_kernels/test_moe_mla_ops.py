"""``torch.library.opcheck`` on the MoE and MLA custom ops (schema, fake, dispatch)."""

from __future__ import annotations

import torch

from deepinfer_kernels.mla.ops import mla_attention_op, write_latent_kv_op
from deepinfer_kernels.moe.ops import fused_moe_op, moe_route_op
from deepinfer_kernels.testing.mla import build_mla_case


def test_opcheck_moe_route() -> None:
    logits, bias = torch.randn(5, 8), torch.randn(8)
    torch.library.opcheck(moe_route_op, (logits, bias, 3, True, 4, 2, 2.5, True))
    torch.library.opcheck(moe_route_op, (logits, None, 2, False, 1, 1, 1.0, False))


def test_opcheck_fused_moe() -> None:
    ids = torch.tensor([[0, 2], [1, -1], [2, 2]], dtype=torch.int32)
    args = (torch.randn(3, 8), torch.randn(3, 12, 8), torch.randn(3, 8, 6), torch.rand(3, 2), ids)
    torch.library.opcheck(fused_moe_op, (*args, False))


def test_opcheck_mla() -> None:
    case = build_mla_case([1, 3], [6, 9], heads=2, rank=16, rope=8, block_size=4, seed=2)
    torch.library.opcheck(mla_attention_op, (*case.tensors(), 0.3, True, 0, False))
    torch.library.opcheck(mla_attention_op, (*case.tensors(), 0.3, False, 0, False))


def test_opcheck_write_latent_kv() -> None:
    cache = torch.zeros(3, 4, 24)
    slots = torch.tensor([0, 5, -1, 11], dtype=torch.int32)
    torch.library.opcheck(write_latent_kv_op, (torch.randn(4, 16), torch.randn(4, 8), cache, slots))
