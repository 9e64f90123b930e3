"""torch.library registration of the verification, sampling and KV ops: opcheck + compile."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _verify_cases import random_problem

import deepinfer_kernels as dk


def _problem():
    ids, p_d, p_t, n = random_problem(6, 3, 10, seed=1)
    gen = torch.Generator().manual_seed(0)
    return ids, p_d, p_t, n, torch.rand(6, 3, generator=gen), torch.rand(6, generator=gen)


def test_opcheck_all_ops():
    ids, p_d, p_t, n, au, su = _problem()
    ops = torch.ops.deepinfer
    torch.library.opcheck(ops.speculative_verify.default, (ids, p_d, p_t, n, au, su, False, True))
    torch.library.opcheck(ops.speculative_verify.default, (ids, None, p_t, n, au, su, False, False))
    torch.library.opcheck(ops.greedy_verify.default, (ids, p_t, n, False))
    logits = torch.randn(6, 10)
    params = (torch.ones(6), torch.full((6,), 3), torch.full((6,), 0.9), torch.zeros(6))
    seed = torch.zeros(1, dtype=torch.int64)  # Philox key of the Triton path's later rounds
    torch.library.opcheck(ops.sample.default, (logits, *params, su, seed, False))
    kc, vc = torch.zeros(3, 2, 2, 4), torch.zeros(3, 2, 2, 4)
    k = torch.randn(4, 2, 4)
    torch.library.opcheck(ops.write_kv.default, (k, k, kc, vc, torch.tensor([0, 5, -1, 2]), False))
    pool = torch.randn(2, 5, 3)
    ids_b = torch.tensor([4, 1])
    torch.library.opcheck(ops.gather_blocks.default, (pool, ids_b, 1, False))
    torch.library.opcheck(ops.scatter_blocks.default, (pool, ids_b, torch.randn(2, 2, 3), 1, False))


def test_compile_fullgraph_over_all_public_ops():
    # No op needs a torch.Generator inside the graph: the public functions draw their
    # uniforms (torch.rand) and pass them to the custom ops as tensors. Value checks, which
    # need host reads, are skipped while tracing.
    ids, p_d, p_t, n, _, _ = _problem()

    def step(ids, p_d, p_t, n, logits, kc, vc, k, slots, pool, block_ids):
        res = dk.speculative_verify(ids, p_d, p_t, n)
        greedy = dk.greedy_verify(ids, p_t, n)
        tok = dk.sample(logits, torch.ones(6), torch.full((6,), 3), torch.full((6,), 0.9), None)
        dk.write_kv(k, k, kc, vc, slots)
        pages = dk.gather_blocks(pool, block_ids, block_dim=1)
        dk.scatter_blocks(pool, block_ids, pages * 2, block_dim=1)
        return res.output_ids, res.num_emitted, greedy.output_ids, tok, pages

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    logits = torch.randn(6, 10)
    kc, vc = torch.zeros(3, 2, 2, 4), torch.zeros(3, 2, 2, 4)
    k = torch.randn(4, 2, 4)
    slots = torch.tensor([0, 5, -1, 2])
    pool = torch.randn(2, 5, 3)
    before = pool.clone()
    block_ids = torch.tensor([4, 1])
    out_ids, emitted, g_ids, tok, pages = compiled(
        ids, p_d, p_t, n, logits, kc, vc, k, slots, pool, block_ids
    )
    assert out_ids.shape == (6, 4) and bool((emitted >= 1).all())
    assert torch.equal(g_ids, dk.greedy_verify(ids, p_t, n).output_ids)
    assert tok.shape == (6,) and bool((tok >= 0).all())
    assert torch.equal(kc.view(-1, 2, 4)[[0, 5, 2]], k[[0, 1, 3]])
    assert torch.equal(pages, before[:, [4, 1]])
    assert torch.equal(pool[:, [4, 1]], 2 * before[:, [4, 1]])


def test_dlpack_numpy_across_ops():
    ids, _, p_t, n, _, _ = _problem()
    res = dk.speculative_verify(ids.numpy(), None, p_t.numpy(), n.numpy())
    assert all(isinstance(x, np.ndarray) for x in res)
    probs = dk.sampling_probs(np.zeros((2, 4), dtype=np.float32), 1.0, 0, 1.0)
    assert isinstance(probs, np.ndarray) and np.allclose(probs, 0.25)


@pytest.mark.gpu
def test_cupy_arrays_in_and_out():
    cp = pytest.importorskip("cupy")
    ids, p_d, p_t, n, _, _ = _problem()
    to_cp = lambda t: cp.asarray(t.numpy())  # noqa: E731
    res = dk.speculative_verify(to_cp(ids), to_cp(p_d), to_cp(p_t), to_cp(n))
    assert isinstance(res.output_ids, cp.ndarray) and res.output_ids.shape == (6, 4)
    g = dk.greedy_verify(to_cp(ids), to_cp(p_t), to_cp(n))
    assert cp.array_equal(g.output_ids, to_cp(dk.greedy_verify(ids, p_t, n).output_ids))
    logits = cp.asarray(np.random.default_rng(0).standard_normal((4, 9)).astype(np.float32))
    tok = dk.sample(logits, 0.0, 0, 1.0)
    assert isinstance(tok, cp.ndarray) and cp.array_equal(tok, logits.argmax(-1))
    cache = cp.arange(24, dtype=cp.float32).reshape(4, 6)
    pages = dk.gather_blocks(cache, cp.asarray([3, 0]))
    assert isinstance(pages, cp.ndarray) and cp.array_equal(pages, cache[cp.asarray([3, 0])])
    dk.scatter_blocks(cache, cp.asarray([1]), cp.zeros((1, 6), dtype=cp.float32))
    assert float(cache[1].sum()) == 0.0
    kc = cp.zeros((2, 2, 1, 3), dtype=cp.float32)
    vc = cp.zeros_like(kc)
    k = cp.ones((1, 1, 3), dtype=cp.float32)
    dk.write_kv(k, k, kc, vc, cp.asarray([2], dtype=cp.int64))
    assert float(kc[1, 0].sum()) == 3.0
