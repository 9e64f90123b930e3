"""``NumpyKernels.causal_attention`` (``causal_prefill_attention.c``): a prompt chunk's causal
attention as two sgemm GEMMs a head and 64-row block, against a float64 reference of the
softmax attention (``reference.cpu.causal_prefill_attention_reference``) and against the tile kernel it replaces."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels.cpu.numpy_ops import NumpyKernels
from deepinfer_kernels.quant.blas_choice import BlasChoice, SingleThreadSgemm
from deepinfer_kernels.reference.cpu import causal_prefill_attention_reference

BLOCK = 16


@pytest.fixture(scope="module")
def sgemm() -> SingleThreadSgemm:
    try:
        found = BlasChoice.resolve("openblas").in_region_sgemm()
    except ValueError:
        found = None
    if found is None:
        pytest.skip("numpy's OpenBLAS (with an ILP64 cblas_sgemm) or threadpoolctl is missing")
    return found


@pytest.fixture(scope="module")
def kernels() -> NumpyKernels:
    k = NumpyKernels()
    if not (k.available() and k.causal_fn.available()):
        pytest.skip(f"compiled CPU kernels unavailable: {k.unavailable_reason()}")
    return k


def _case(t: int, start: int, hq: int, hkv: int, d: int, extra: int, seed: int):
    rng = np.random.default_rng(seed)
    keys = start + t
    blocks = -(-(keys + extra) // BLOCK)
    k_cache = rng.standard_normal((blocks, BLOCK, hkv, d), dtype=np.float32)
    v_cache = rng.standard_normal((blocks, BLOCK, hkv, d), dtype=np.float32)
    width = (hq + 2 * hkv) * d + extra  # Q first; the rest of the row is never read as Q
    qkv = (rng.standard_normal((t, width), dtype=np.float32) * 2).astype(np.float32)
    return qkv, k_cache, v_cache


@settings(max_examples=25, deadline=None)
@given(
    t=st.integers(1, 150),
    start=st.integers(0, 90),
    heads=st.sampled_from([(1, 1), (4, 2), (6, 3), (8, 1), (9, 3)]),
    d=st.sampled_from([8, 20, 32, 64, 72]),
    extra=st.integers(0, 5),
    threads=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**16),
)
def test_matches_the_float64_reference(
    sgemm: SingleThreadSgemm, kernels: NumpyKernels, t: int, start: int,
    heads: tuple[int, int], d: int, extra: int, threads: int, seed: int,
) -> None:  # fmt: skip
    hq, hkv = heads
    qkv, k_cache, v_cache = _case(t, start, hq, hkv, d, extra, seed)
    scale = float(d) ** -0.5
    out = np.full((t, hq, d), np.nan, dtype=np.float32)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)  # the kernels' OpenMP pool (torch's runtime here)
        with sgemm.one_thread() as address:
            kernels.causal_attention(qkv, hq, d, k_cache, v_cache, out, start=start,
                                     scale=scale, sgemm=address)  # fmt: skip
    finally:
        torch.set_num_threads(before)
    want = causal_prefill_attention_reference(
        torch.from_numpy(qkv),
        hq,
        d,
        torch.from_numpy(k_cache),
        torch.from_numpy(v_cache),
        start,
        scale,
    ).numpy()
    # fp32 scores and sums: a few ulp of the values' size (|v| ~ 1, 3 sigma ~ 4).
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-5 * max(1.0, np.abs(want).max()))


def test_edges_agree_with_the_tile_kernel(sgemm: SingleThreadSgemm, kernels: NumpyKernels) -> None:
    """The first row sees one key (its output is that key's value exactly); a chunk after a
    cached prefix gives the tile kernel's result to fp32 rounding."""
    hq, hkv, d, t, start = 6, 2, 64, 70, 45
    qkv, k_cache, v_cache = _case(t, start, hq, hkv, d, 0, seed=1)
    out = np.empty((t, hq, d), np.float32)
    with sgemm.one_thread() as address:
        kernels.causal_attention(qkv, hq, d, k_cache, v_cache, out, start=0, scale=0.125,
                                 sgemm=address)  # fmt: skip
        # One key: its weight is exactly 1, so the value row comes back bit for bit.
        first = np.repeat(v_cache.reshape(-1, hkv, d)[0], hq // hkv, axis=0)
        np.testing.assert_array_equal(out[0], first)
        kernels.causal_attention(qkv, hq, d, k_cache, v_cache, out, start=start, scale=0.125,
                                 sgemm=address)  # fmt: skip
    keys, tiles = start + t, -(-t // BLOCK)
    padded = np.zeros((tiles * BLOCK, qkv.shape[1]), np.float32)
    padded[:t] = qkv
    rows = np.arange(tiles * BLOCK)
    keep = (np.arange(keys)[None, :] <= start + rows[:, None]) & (rows < t)[:, None]
    pages = -(-keys // BLOCK)
    tiles_out = np.zeros((tiles * BLOCK, hq, d), np.float32)
    kernels.attention(
        padded, hq, d, k_cache, v_cache, tiles_out,
        page_ids=np.tile(np.arange(pages, dtype=np.int64), tiles),
        keep=np.ascontiguousarray(keep.reshape(tiles, BLOCK, keys)), num_tiles=tiles,
        max_q=BLOCK, num_pages=pages, key_len=keys, scale=0.125,
    )  # fmt: skip
    np.testing.assert_allclose(out, tiles_out[:t], rtol=0, atol=1e-5)


def test_bad_arguments_name_themselves(sgemm: SingleThreadSgemm, kernels: NumpyKernels) -> None:
    qkv, k_cache, v_cache = _case(20, 0, 4, 2, 8, 0, seed=2)
    out = np.empty((20, 4, 8), np.float32)

    def call(heads: int = 4, start: int = 0, address: int = sgemm.address, **arrays) -> None:
        given = {"qkv": qkv, "out": out, **arrays}
        kernels.causal_attention(given["qkv"], heads, 8, k_cache, v_cache, given["out"],
                                 start=start, scale=0.3, sgemm=address)  # fmt: skip

    with pytest.raises(ValueError, match="start"):
        call(start=13)
    with pytest.raises(ValueError, match="sgemm"):
        call(address=0)
    with pytest.raises(ValueError, match="num_heads"):
        call(heads=3)
    with pytest.raises(ValueError, match="out"):
        call(out=out[:, :2])
    with pytest.raises(ValueError, match="qkv"):
        call(qkv=qkv.astype(np.float64))
