"""The fused residual add + RMSNorm CPU kernel against the torch ops it replaces."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from _cpu import built
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels.cpu.add_rms_norm import AddRmsNorm, add_rms_norm


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> AddRmsNorm:
    return built(AddRmsNorm(cache_dir=tmp_path_factory.mktemp("kernels"), enabled=True))


@settings(max_examples=50)
@given(
    lead=st.lists(st.integers(1, 9), min_size=1, max_size=2),
    size=st.sampled_from([1, 15, 16, 17, 33, 64, 576]),
    with_delta=st.booleans(),
    eps=st.sampled_from([1e-6, 1e-5, 0.5]),
    seed=st.integers(0, 2**16),
)
def test_matches_the_torch_ops(kernel: AddRmsNorm, lead, size, with_delta, eps, seed) -> None:
    """The sum is the same fp32 add (bit for bit); the norm agrees to fp32 rounding."""
    gen = torch.Generator().manual_seed(seed)
    residual = torch.randn(*lead, size, generator=gen) * 3
    delta = torch.randn(*lead, size, generator=gen) if with_delta else None
    weight = torch.randn(size, generator=gen)
    with torch.inference_mode():
        summed, normed = kernel(residual, delta, weight, eps)
    want = residual if delta is None else residual + delta
    assert torch.equal(summed, want)
    if delta is None:
        assert summed is residual  # nothing added, nothing copied
    ref = F.rms_norm(want.double(), (size,), weight.double(), eps).float()
    torch.testing.assert_close(normed, ref, rtol=1e-5, atol=1e-6)


def test_does_not_write_its_inputs(kernel: AddRmsNorm) -> None:
    """Layer outputs captured for the drafter alias the residual: it must stay as it was."""
    residual, delta, weight = torch.randn(3, 40), torch.randn(3, 40), torch.randn(40)
    before = residual.clone(), delta.clone(), weight.clone()
    with torch.inference_mode():
        kernel(residual, delta, weight, 1e-5)
    for now, then in zip((residual, delta, weight), before):
        assert torch.equal(now, then)


def test_dispatch_falls_back_where_the_kernel_does_not_apply(kernel: AddRmsNorm) -> None:
    residual, delta, weight = torch.randn(4, 32), torch.randn(4, 32), torch.randn(32)
    ref = F.rms_norm(residual + delta, (32,), weight, 1e-5)
    # autograd on, a transposed delta, half precision: torch ops, same values
    for r, d, w in (
        (residual.clone().requires_grad_(), delta, weight),
        (residual, delta.t().contiguous().t(), weight),
    ):
        summed, normed = add_rms_norm(r, d, w, 1e-5, kernel)
        torch.testing.assert_close(summed.detach(), residual + delta)
        torch.testing.assert_close(normed, ref, rtol=1e-5, atol=1e-6)
    _, normed = add_rms_norm(residual.half(), delta.half(), weight.half(), 1e-5, kernel)
    assert normed.dtype == torch.float16
    with pytest.raises(ValueError, match="contiguous fp32"), torch.inference_mode():
        kernel(residual, delta[:, :16], weight, 1e-5)


def test_unbuildable_kernel_falls_back(tmp_path: Path, no_c_compiler: None) -> None:
    k = AddRmsNorm(cache_dir=tmp_path, enabled=True)
    residual, weight = torch.randn(2, 8), torch.randn(8)
    with torch.inference_mode(), pytest.warns(RuntimeWarning, match="no C compiler"):
        summed, normed = add_rms_norm(residual, None, weight, 1e-5, k)
    assert summed is residual
    torch.testing.assert_close(normed, F.rms_norm(residual, (8,), weight, 1e-5))
