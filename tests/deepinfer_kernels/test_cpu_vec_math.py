"""``csrc/vec_math.h``'s vectorised expf (decode attention, SiLU) against float64 exp."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from deepinfer_kernels.cpu import compiler_available
from deepinfer_kernels.cpu.native import NativeFunction
from deepinfer_kernels.cpu.sources import VEC_MATH

MAX_ULP = 2  # the bound vec_math.h promises (1 measured over every 7th float in [-110, 90])


@pytest.fixture(scope="module")
def vexp(tmp_path_factory: pytest.TempPathFactory) -> NativeFunction:
    if not compiler_available():
        pytest.skip("no C compiler on this machine")
    fn = NativeFunction(VEC_MATH, "deepinfer_vec_expf", cache_dir=tmp_path_factory.mktemp("k"))
    assert fn.available(), fn.error
    return fn


def _exp(fn: NativeFunction, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.empty_like(x)
    fn(x.ctypes.data, y.ctypes.data, x.size)
    return y


def _ordinal(v: np.ndarray) -> np.ndarray:
    """Floats as integers in value order (adjacent floats differ by 1; -0 and +0 are both 0)."""
    i = v.view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)


def _ulps(got: np.ndarray, x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        want = np.exp(x.astype(np.float64)).astype(np.float32)  # correctly rounded but for ties
    return np.abs(_ordinal(got) - _ordinal(want))


def test_within_two_ulp_over_the_whole_range(vexp: NativeFunction) -> None:
    """Every 997th float from -110 to 90: normal results, subnormal ones, 0 and +inf."""
    top = np.float32(90).view(np.int32)
    bottom = np.float32(110).view(np.int32)
    pos = np.arange(0, top, 997, dtype=np.int32).view(np.float32)
    neg = -np.arange(0, bottom, 997, dtype=np.int32).view(np.float32)
    x = np.concatenate([pos, neg])
    u = _ulps(_exp(vexp, x), x)
    assert u.max() <= MAX_ULP, (x[u.argmax()], u.max())


def test_special_values(vexp: NativeFunction) -> None:
    x = np.array([0.0, -0.0, np.inf, -np.inf, 88.72283, 88.72284, 1e30, -103.97, -104.0, -1e30],
                 dtype=np.float32)  # fmt: skip
    got = _exp(vexp, x)
    assert got[0] == got[1] == 1.0
    assert got[2] == np.inf and got[3] == 0.0  # exp(-inf) = 0: masked attention scores
    assert np.isfinite(got[4]) and got[5] == np.inf and got[6] == np.inf
    assert 0 < got[7] < np.finfo(np.float32).tiny and got[8] == 0.0 and got[9] == 0.0
    assert np.isnan(_exp(vexp, np.array([np.nan, 1.0], dtype=np.float32))[0])


@settings(max_examples=60, deadline=None)
@given(
    x=arrays(
        np.float32,
        st.integers(1, 37),  # the 8-lane body and every tail length
        elements=st.floats(-110, 90, width=32),
    ),
    shift=st.integers(0, 7),
)
def test_any_length_and_position(vexp: NativeFunction, x: np.ndarray, shift: int) -> None:
    """Within the bound for any buffer length, and a value's result does not depend on where
    it sits in the buffer (the tail takes the same vector code as the body)."""
    got = _exp(vexp, x)
    assert _ulps(got, x).max() <= MAX_ULP
    shifted = _exp(vexp, np.concatenate([np.zeros(shift, np.float32), x]))[shift:]
    assert np.array_equal(got, shifted)
