"""DLPack interop: NumPy and JAX answered in kind, unknown array kinds refused clearly (#23
item 8)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import deepinfer_kernels as dk
from deepinfer_kernels.reference import merge_attention_states_reference


class ForeignArray:
    """An array from a library that exports DLPack but offers no ``from_dlpack`` to import."""

    def __init__(self, t: torch.Tensor) -> None:
        self._t = t

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._t.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self._t.__dlpack_device__()


def _states(seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    o_a, o_b = torch.randn(2, 5, 3, 8, generator=gen)
    lse_a, lse_b = torch.randn(2, 5, 3, generator=gen)
    return [o_a, lse_a, o_b, lse_b]


def test_numpy_round_trip() -> None:
    states = _states(0)
    out, lse = dk.merge_attention_states(*(t.numpy() for t in states))
    assert isinstance(out, np.ndarray) and isinstance(lse, np.ndarray)
    want, want_lse = merge_attention_states_reference(*states)
    np.testing.assert_allclose(out, want.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(lse, want_lse.numpy(), rtol=1e-6, atol=1e-6)


def test_jax_round_trip() -> None:
    jnp = pytest.importorskip("jax.numpy")
    states = _states(1)
    out, lse = dk.merge_attention_states(*(jnp.asarray(t.numpy()) for t in states))
    assert type(out).__module__.split(".")[0] in ("jax", "jaxlib")
    want, want_lse = merge_attention_states_reference(*states)
    np.testing.assert_allclose(np.asarray(out), want.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(lse), want_lse.numpy(), rtol=1e-6, atol=1e-6)


def test_array_kind_without_importer_is_refused() -> None:
    states = _states(2)
    foreign = [ForeignArray(t) for t in states]
    with pytest.raises(TypeError, match=r"input 0: .*ForeignArray arrays cannot be returned"):
        dk.merge_attention_states(*foreign)
    # Mixed with torch tensors, the first foreign input decides the answer's kind.
    with pytest.raises(TypeError, match=r"input 2: .*ForeignArray"):
        dk.merge_attention_states(states[0], states[1], foreign[2], states[3])


def test_non_array_names_the_argument() -> None:
    o_a, lse_a, o_b, _ = _states(3)
    with pytest.raises(TypeError, match=r"^lse_b: expected a torch\.Tensor"):
        dk.merge_attention_states(o_a, lse_a, o_b, [0.0])
