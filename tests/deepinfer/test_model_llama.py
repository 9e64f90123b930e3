"""LlamaModel: the paged ragged forward equals a plain dense causal forward."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from model_helpers import dense_reference_logits, random_hf_state, tiny_config

from deepinfer.models import AttentionMetadata, KVPool, LlamaModel, build_model


@pytest.fixture(scope="module")
def tiny() -> tuple[LlamaModel, dict[str, torch.Tensor]]:
    cfg = tiny_config()
    state = random_hf_state(cfg, seed=1)
    return build_model(cfg, state), state


def test_dense_forward_matches_independent_fp64_reference(tiny) -> None:
    model, state = tiny
    ids = [5, 17, 200, 3, 9, 41, 120, 7, 7, 250]
    with torch.inference_mode():
        hidden, _ = model.forward_dense(torch.tensor([ids]))
        logits = model.compute_logits(hidden)[0]
    ref = dense_reference_logits(model.config, state, ids)
    torch.testing.assert_close(logits.double(), ref, atol=2e-4, rtol=2e-4)


def test_untied_head_and_qkv_bias_match_reference() -> None:
    cfg = tiny_config(tie_word_embeddings=False, attention_bias=True)
    state = random_hf_state(cfg, seed=2)
    model = build_model(cfg, state)
    ids = [4, 8, 15, 16, 23, 42]
    with torch.inference_mode():
        hidden, _ = model.forward_dense(torch.tensor([ids]))
    ref = dense_reference_logits(cfg, state, ids)
    torch.testing.assert_close(model.compute_logits(hidden)[0].double(), ref, atol=2e-4, rtol=2e-4)


@st.composite
def schedules(draw: st.DrawFn) -> tuple[list[list[int]], int, int]:
    """Per-sequence chunk lengths (step k runs chunk k of every sequence that has one: prefill
    chunks of one sequence mix with 1-token decode-like steps of another), block size, seed."""
    n_seq = draw(st.integers(1, 3))
    lengths = [draw(st.integers(1, 14)) for _ in range(n_seq)]
    chunks: list[list[int]] = []
    for length in lengths:
        parts, left = [], length
        while left:
            take = draw(st.integers(1, left))
            parts.append(take)
            left -= take
        chunks.append(parts)
    block_size = draw(st.sampled_from([1, 4, 16]))
    return chunks, block_size, draw(st.integers(0, 2**16))


@settings(max_examples=15)
@given(schedules())
def test_paged_ragged_forward_equals_dense(tiny, sched) -> None:
    model, _ = tiny
    chunks, block_size, seed = sched
    rng = random.Random(seed)
    cfg = model.config
    seqs = [[rng.randrange(cfg.vocab_size) for _ in range(sum(c))] for c in chunks]
    pool = KVPool.for_model(cfg, num_blocks=64, block_size=block_size)
    # Shuffle the free list so each sequence's blocks are scattered through the pool.
    free = pool.allocate(pool.num_blocks)
    rng.shuffle(free)
    pool.free(free)

    with torch.inference_mode():
        dense = [model.forward_dense(torch.tensor([s]))[0][0] for s in seqs]
        done = [0] * len(seqs)
        tables: list[list[int]] = [[] for _ in seqs]
        step = 0
        while any(done[i] < len(seqs[i]) for i in range(len(seqs))):
            batch = [i for i in range(len(seqs)) if step < len(chunks[i])]
            step += 1
            if not batch:
                continue
            q_lens = [chunks[i][step - 1] for i in batch]
            seq_lens = [done[i] + q for i, q in zip(batch, q_lens)]
            for i, n in zip(batch, seq_lens):
                tables[i] += pool.allocate(-(-n // block_size) - len(tables[i]))
            attn = AttentionMetadata.build([tables[i] for i in batch], seq_lens, q_lens, block_size)
            ids = torch.tensor(
                [t for i, q in zip(batch, q_lens) for t in seqs[i][done[i] : done[i] + q]]
            )
            hidden = model(ids, attn.positions(), attn, pool)
            row = 0
            for i, q in zip(batch, q_lens):
                torch.testing.assert_close(
                    hidden[row : row + q], dense[i][done[i] : done[i] + q], atol=1e-5, rtol=1e-5
                )
                row += q
                done[i] += q


def test_forward_with_layers_returns_residual_stream(tiny) -> None:
    model, _ = tiny
    ids = torch.tensor([3, 1, 4, 1, 5, 9])
    pool = KVPool.for_model(model.config, num_blocks=4, block_size=4)
    attn = AttentionMetadata.build([pool.allocate(2)], [6], [6], 4)
    with torch.inference_mode():
        final, layers = model.forward_with_layers(ids, attn.positions(), attn, pool, [1, 0])
        _dense_final, dense_layers = model.forward_dense(ids[None], [1, 0])
    assert [t.shape for t in layers] == [(6, 32), (6, 32)]
    torch.testing.assert_close(layers[0], dense_layers[0][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(layers[1], dense_layers[1][0], atol=1e-5, rtol=1e-5)
    # The last layer's output, normed, is the final hidden state.
    torch.testing.assert_close(model.norm(layers[0]), final, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(layers[0], layers[1])


def test_hf_state_dict_round_trips(tiny) -> None:
    model, state = tiny
    out = model.hf_state_dict()
    assert set(out) == set(state)
    for name, tensor in state.items():
        torch.testing.assert_close(out[name], tensor, atol=0, rtol=0)


def test_load_rejects_mismatched_checkpoints(tiny) -> None:
    model, state = tiny
    fresh = LlamaModel(model.config)
    broken = dict(state)
    del broken["model.norm.weight"]
    with pytest.raises(ValueError, match="missing"):
        fresh.load_hf_state_dict(broken)
    bad_shape = dict(state)
    bad_shape["model.norm.weight"] = torch.ones(7)
    with pytest.raises(ValueError, match="shape"):
        fresh.load_hf_state_dict(bad_shape)


def test_bad_inputs_raise(tiny) -> None:
    model, _ = tiny
    pool = KVPool.for_model(model.config, num_blocks=2, block_size=4)
    attn = AttentionMetadata.build([pool.allocate(1)], [2], [2], 4)
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.tensor([1, model.config.vocab_size]), attn.positions(), attn, pool)
    with pytest.raises(ValueError, match="slot_mapping covers 2"):
        model(torch.tensor([1, 2, 3]), torch.tensor([0, 1, 2]), attn, pool)
    # Both ways of checking the range: a short list (<= 16 ids) and tensor reductions.
    vocab = model.config.vocab_size
    for count in (1, 16, 17, 40):
        for bad in (-1, vocab):
            ids = torch.zeros(count, dtype=torch.int64)
            ids[count // 2] = bad
            with pytest.raises(ValueError, match="input_ids must be in"):
                model.embed(ids)
        assert model.embed(torch.full((count,), vocab - 1)).shape[0] == count
    with pytest.raises(TypeError, match="integer"):
        model(torch.tensor([1.0, 2.0]), attn.positions(), attn, pool)
    with pytest.raises(ValueError, match="layer_ids"):
        model.forward_dense(torch.tensor([[1, 2]]), [5])
    wrong_pool = KVPool(3, 2, 4, 2, 8)
    with pytest.raises(ValueError, match="layers"):
        model(torch.tensor([1, 2]), attn.positions(), attn, wrong_pool)


def test_bf16_model_stays_close_to_fp32(tiny) -> None:
    model, state = tiny
    bf16 = build_model(model.config, state, dtype=torch.bfloat16)
    ids = torch.tensor([[10, 20, 30, 40, 50]])
    with torch.inference_mode():
        a = model.compute_logits(model.forward_dense(ids)[0])
        b = bf16.compute_logits(bf16.forward_dense(ids)[0])
    assert b.dtype == torch.float32
    assert (a - b).abs().max() < 0.15 * a.abs().max()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_forward_on_cuda_matches_dense(dtype: torch.dtype) -> None:
    """On CUDA the Triton kernels serve the paged path; it must agree with SDPA's dense path."""
    cfg = tiny_config()
    model = build_model(cfg, random_hf_state(cfg, seed=8), dtype=dtype, device="cuda")
    pool = KVPool.for_model(cfg, num_blocks=16, block_size=16, dtype=dtype, device="cuda")
    seqs = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21], [30, 31, 32]]
    tables = [pool.allocate(2), pool.allocate(1)]
    with torch.inference_mode():
        attn = AttentionMetadata.build(tables, [17, 3], [17, 3], 16, device="cuda")
        ids = torch.tensor(seqs[0] + seqs[1], device="cuda")
        hidden = model(ids, attn.positions(), attn, pool)
        dense = [model.forward_dense(torch.tensor([s], device="cuda"))[0][0] for s in seqs]
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(hidden[:17], dense[0], atol=tol, rtol=tol)
    torch.testing.assert_close(hidden[17:], dense[1], atol=tol, rtol=tol)


def test_reloaded_weights_are_used_after_an_inference_forward() -> None:
    """The CPU packed weight copies follow a reload: outputs match the new checkpoint's
    reference, never the old weights'."""
    cfg = tiny_config(tie_word_embeddings=False, attention_bias=True)
    first, second = random_hf_state(cfg, seed=3), random_hf_state(cfg, seed=4)
    model = build_model(cfg, first)
    ids = [4, 8, 15, 16, 23, 42]
    with torch.inference_mode():
        hidden, _ = model.forward_dense(torch.tensor([ids]))
        model.compute_logits(hidden)
    model.load_hf_state_dict(second)
    with torch.inference_mode():
        hidden, _ = model.forward_dense(torch.tensor([ids]))
        logits = model.compute_logits(hidden)[0]
    ref = dense_reference_logits(cfg, second, ids)
    torch.testing.assert_close(logits.double(), ref, atol=2e-4, rtol=2e-4)


def test_moving_the_model_drops_the_packed_weight_copies() -> None:
    """``.to()`` releases the CPU packed copies (and the fp32 weights they hold); the moved
    model still computes the same logits."""
    cfg = tiny_config()
    model = build_model(cfg, random_hf_state(cfg, seed=5))
    ids = torch.tensor([[4, 8, 15, 16, 23, 42]])
    with torch.inference_mode():
        hidden, _ = model.forward_dense(ids)
        before = model.compute_logits(hidden)
    packs = [m.packed for m in model.modules() if hasattr(m, "packed")] + [model._head_packed]
    if not any(p.is_packed for p in packs):
        pytest.skip("this torch build has no MKL packed GEMM")
    model.to(torch.float64).to(torch.float32)
    assert not any(p.is_packed for p in packs)
    with torch.inference_mode():
        hidden, _ = model.forward_dense(ids)
        torch.testing.assert_close(model.compute_logits(hidden), before, rtol=1e-5, atol=1e-5)
