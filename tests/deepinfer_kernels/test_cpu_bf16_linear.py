"""The bf16-weight CPU kernel: exact in value, used only where it is exact, built once."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from _cpu import built
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels.cpu.bf16_weight_linear import (
    SOURCE,
    Bf16WeightLinear,
    bf16_panels,
    unpack_panels,
)
from deepinfer_kernels.cpu.linear import BF16_MAX_ROWS, PackedWeight, linear
from deepinfer_kernels.cpu.native import LoadedLibraries, build_library, compiler_available

needs_compiler = pytest.mark.skipif(not compiler_available(), reason="no C compiler here")


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Bf16WeightLinear:
    return built(Bf16WeightLinear(cache_dir=tmp_path_factory.mktemp("kernels"), enabled=True))


def bf16_exact(*shape: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).bfloat16().float()


@settings(max_examples=60)
@given(
    rows=st.integers(1, 20),  # passes of 8 rows
    out_features=st.integers(1, 100),
    in_features=st.sampled_from([1, 5, 16, 33, 100]),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_integer_inputs_give_exact_results(
    kernel: Bf16WeightLinear, rows, out_features, in_features, bias, seed
) -> None:
    """Small integers multiply and sum exactly in fp32 in any order, so every output must equal
    the reference bit for bit: a dropped k, a wrong panel column or a swapped low/high half
    shows as a wrong integer. Covers N below, at and across the 32-column panels (the padded
    last panel) and M across the 8-row passes."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(-8, 9, (rows, in_features), generator=gen).float()
    w = torch.randint(-8, 9, (out_features, in_features), generator=gen).float()
    b = torch.randint(-8, 9, (out_features,), generator=gen).float() if bias else None
    panels = bf16_panels(w)
    assert panels is not None
    got = kernel(x, panels, out_features, b)
    assert torch.equal(got, F.linear(x, w, b))


@settings(max_examples=30)
@given(
    rows=st.integers(1, 12),
    out_features=st.integers(1, 40),
    in_features=st.sampled_from([7, 32, 96, 576]),
    seed=st.integers(0, 2**16),
)
def test_random_inputs_match_to_fp32_rounding(
    kernel: Bf16WeightLinear, rows, out_features, in_features, seed
) -> None:
    """Against a float64 reference, the error stays within the bound of fp32 summation in
    order: ``|y - y64| <= K * 2^-24 * sum_k |x_k w_k|``."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features, generator=gen)
    w = bf16_exact(out_features, in_features, gen=gen)
    panels = bf16_panels(w)
    assert panels is not None
    got = kernel(x, panels, out_features).double()
    ref = F.linear(x.double(), w.double())
    bound = in_features * 2.0**-24 * F.linear(x.double().abs(), w.double().abs())
    assert bool(((got - ref).abs() <= bound + 1e-30).all())


def test_results_do_not_depend_on_the_thread_count(kernel: Bf16WeightLinear) -> None:
    """Each output is summed by one thread in a fixed order."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 576, generator=gen)
    panels = bf16_panels(bf16_exact(1536, 576, gen=gen))
    assert panels is not None
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel(x, panels, 1536)
        torch.set_num_threads(2)
        two = kernel(x, panels, 1536)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


@pytest.mark.parametrize("out_features", [1, 31, 32, 33, 70])
def test_panels_only_for_exact_weights(out_features: int) -> None:
    gen = torch.Generator().manual_seed(out_features)
    w = bf16_exact(out_features, 10, gen=gen)
    w[0, 0], w[0, 1], w[0, 2] = -0.0, float("inf"), -3.5
    panels = bf16_panels(w)
    assert panels is not None and panels.dtype == torch.int16
    assert panels.shape == (-(-out_features // 32), 10, 16, 2)
    assert torch.equal(unpack_panels(panels, out_features), w)
    assert bool((panels.permute(0, 3, 2, 1).reshape(-1, 10)[out_features:] == 0).all())
    assert bf16_panels(w + 1e-4) is None  # low bits set
    nan = w.clone()
    nan.view(torch.int32)[0, 3] = 0x7FC00001  # a NaN with a payload in the low half
    assert bf16_panels(nan) is None
    assert bf16_panels(w.double()) is None
    assert bf16_panels(w[0]) is None  # not a matrix


def test_bad_arguments_are_named(kernel: Bf16WeightLinear) -> None:
    panels = torch.zeros(1, 8, 16, 2, dtype=torch.int16)
    with pytest.raises(ValueError, match="x must be"):
        kernel(torch.zeros(2, 8, dtype=torch.float64), panels, 4)
    with pytest.raises(ValueError, match="panels must be int16"):
        kernel(torch.zeros(2, 9), panels, 4)
    with pytest.raises(ValueError, match="panels must be int16"):
        kernel(torch.zeros(2, 8), panels, 40)  # 40 columns need two panels
    with pytest.raises(ValueError, match="panels must be contiguous"):
        kernel(torch.zeros(2, 8), torch.zeros(1, 16, 8, 2, dtype=torch.int16).transpose(1, 2), 4)
    with pytest.raises(ValueError, match="bias must be"):
        kernel(torch.zeros(2, 8), panels, 4, torch.zeros(3))
    assert kernel(torch.zeros(0, 8), panels, 4).shape == (0, 4)


def test_linear_uses_the_kernel_only_where_it_is_exact(kernel: Bf16WeightLinear) -> None:
    gen = torch.Generator().manual_seed(2)
    exact = bf16_exact(48, 64, gen=gen)
    inexact = torch.randn(48, 64, generator=gen)
    x = torch.randn(BF16_MAX_ROWS, 64, generator=gen)
    with torch.inference_mode():
        pack = PackedWeight(kernel)
        got = linear(x, exact, pack=pack)
        assert pack.has_bf16
        torch.testing.assert_close(got, F.linear(x, exact), rtol=1e-5, atol=1e-5)
        # Not bf16-exact: no panels are made and the MKL / F.linear paths answer.
        pack = PackedWeight(kernel)
        torch.testing.assert_close(linear(x, inexact, pack=pack), F.linear(x, inexact))
        assert pack.bf16(inexact) is None
        # More rows than BF16_MAX_ROWS never ask for panels.
        pack = PackedWeight(kernel)
        more = torch.randn(BF16_MAX_ROWS + 1, 64, generator=gen)
        torch.testing.assert_close(linear(more, exact, pack=pack), F.linear(more, exact))
        assert not pack.has_bf16


def test_panels_follow_the_weight(kernel: Bf16WeightLinear) -> None:
    """An in-place change or a new tensor is never served from stale panels."""
    gen = torch.Generator().manual_seed(3)
    w = bf16_exact(20, 40, gen=gen)
    x = torch.randn(2, 40, generator=gen)
    pack = PackedWeight(kernel)
    with torch.no_grad():
        torch.testing.assert_close(linear(x, w, pack=pack), F.linear(x, w))
        w.mul_(-2.0)  # still bf16-exact; the version counter moves
        torch.testing.assert_close(linear(x, w, pack=pack), F.linear(x, w))
        w.add_(1e-3)  # no longer bf16-exact
        torch.testing.assert_close(linear(x, w, pack=pack), F.linear(x, w))
        assert pack.bf16(w) is None
        w2 = bf16_exact(20, 40, gen=gen)
        torch.testing.assert_close(linear(x, w2, pack=pack), F.linear(x, w2))


def test_autograd_takes_the_plain_path(kernel: Bf16WeightLinear) -> None:
    gen = torch.Generator().manual_seed(4)
    w = bf16_exact(8, 32, gen=gen).requires_grad_()
    x = torch.randn(2, 32, generator=gen, requires_grad=True)
    pack = PackedWeight(kernel)
    linear(x, w, pack=pack).sum().backward()
    assert not pack.has_bf16
    assert x.grad is not None and w.grad is not None


@needs_compiler
def test_build_is_cached_and_a_damaged_file_is_rebuilt(tmp_path: Path) -> None:
    path = build_library(SOURCE, tmp_path)
    stamp = path.stat().st_mtime_ns
    assert build_library(SOURCE, tmp_path) == path
    assert path.stat().st_mtime_ns == stamp  # reused, not rebuilt
    path.write_bytes(b"not a shared library")
    damaged = Bf16WeightLinear(cache_dir=tmp_path, enabled=True)
    with pytest.warns(RuntimeWarning, match="unavailable"):
        assert not damaged.available()
    assert not path.exists()  # moved out of the way
    # This process remembers the failure (no retry per symbol); the next process rebuilds.
    again = Bf16WeightLinear(cache_dir=tmp_path, enabled=True)
    assert not again.available() and not path.exists()
    LoadedLibraries().load(SOURCE, tmp_path)
    assert path.is_file()
    rebuilt = Bf16WeightLinear(cache_dir=tmp_path / "other", enabled=True)
    assert rebuilt.available(), rebuilt.error
    x, w = torch.ones(1, 4), torch.ones(3, 4)
    panels = bf16_panels(w)
    assert panels is not None
    assert torch.equal(rebuilt(x, panels, 3), torch.full((1, 3), 4.0))


def test_without_a_compiler_linear_falls_back(tmp_path: Path, no_c_compiler: None) -> None:
    k = Bf16WeightLinear(cache_dir=tmp_path, enabled=True)
    with pytest.warns(RuntimeWarning, match="no C compiler"):
        assert not k.available()
    assert not k.available()  # warned once, not retried
    gen = torch.Generator().manual_seed(5)
    w, x = bf16_exact(8, 16, gen=gen), torch.randn(1, 16, generator=gen)
    with torch.inference_mode():
        assert torch.equal(linear(x, w, pack=PackedWeight(k)), F.linear(x, w))
    with pytest.raises(RuntimeError, match="unavailable"):
        k(x, torch.zeros(1, 16, 16, 2, dtype=torch.int16), 8)


def test_env_switch_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPINFER_CPU_KERNELS", "0")
    assert not Bf16WeightLinear().available()
    monkeypatch.setenv("DEEPINFER_CPU_KERNELS", "1")
    assert Bf16WeightLinear(enabled=False).available() is False


@needs_compiler
def test_unwritable_cache_directory_falls_back(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    k = Bf16WeightLinear(cache_dir=blocker / "kernels", enabled=True)
    with pytest.warns(RuntimeWarning, match="cannot build into"):
        assert not k.available()
    gen = torch.Generator().manual_seed(9)
    w, x = bf16_exact(8, 16, gen=gen), torch.randn(1, 16, generator=gen)
    with torch.inference_mode():
        assert torch.equal(linear(x, w, pack=PackedWeight(k)), F.linear(x, w))
