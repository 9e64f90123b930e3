"""LlamaTargetAdapter honours deepinfer_spec's TargetAdapter contract, checked against recomputation."""

from __future__ import annotations

import pytest
import torch
from model_helpers import random_hf_state, tiny_config

from deepinfer.models import KVPool, build_model
from deepinfer.models.spec_adapter import LlamaTargetAdapter
from deepinfer_spec.adapter import SupportsLayerWeights, SupportsLmHeadRows, TargetAdapter
from deepinfer_spec.recompute_target import RecomputeTarget

LAYERS = [0, 1]


@pytest.fixture
def pair():
    cfg = tiny_config()
    model = build_model(cfg, random_hf_state(cfg, seed=5))
    pool = KVPool.for_model(cfg, num_blocks=32, block_size=4)
    return LlamaTargetAdapter(model, pool), RecomputeTarget(LlamaTargetAdapter(model, pool))


def _check_step(adapter, reference, seq_ids, rows, lens) -> None:
    ids = torch.tensor(rows)
    n = torch.tensor(lens)
    with torch.inference_mode():
        got = adapter.extend(seq_ids, ids, n, LAYERS)
        ref = reference.extend(seq_ids, ids, n, LAYERS)
    for b, k in enumerate(lens):
        torch.testing.assert_close(got.logits[b, :k], ref.logits[b, :k], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got.features[b, :k], ref.features[b, :k], atol=1e-4, rtol=1e-4)
    assert got.features.shape == (len(rows), len(rows[0]), 2 * adapter.hidden_size)


def test_protocols_are_implemented(pair) -> None:
    adapter, _ = pair
    assert isinstance(adapter, TargetAdapter)
    assert isinstance(adapter, SupportsLayerWeights)
    weights = adapter.layer_state_dict(1)
    assert set(weights) == {
        "input_layernorm.weight",
        "q_proj.weight",
        "k_proj.weight",
        "v_proj.weight",
        "o_proj.weight",
        "post_attention_layernorm.weight",
        "gate_proj.weight",
        "up_proj.weight",
        "down_proj.weight",
    }
    assert weights["k_proj.weight"].shape == (adapter.model.config.kv_size, 32)


def test_extend_truncate_release_match_recomputation(pair) -> None:
    adapter, reference = pair
    pool = adapter.kv_pool
    free0 = pool.num_free_blocks
    # Prefill two prompts of different lengths (right-padded).
    _check_step(
        adapter, reference, ["a", "b"], [[5, 6, 7, 8, 9, 10, 11], [20, 21, 22, 0, 0, 0, 0]], [7, 3]
    )
    # A speculative step: anchor + 3 drafts each, then reject some.
    _check_step(adapter, reference, ["a", "b"], [[12, 13, 14, 15], [23, 24, 25, 26]], [4, 4])
    assert adapter.length("a") == 11 and adapter.length("b") == 7
    keep = torch.tensor([9, 5])
    adapter.truncate(["a", "b"], keep)
    reference.truncate(["a", "b"], keep)
    assert pool.num_free_blocks == free0 - 3 - 2  # ceil(9/4) + ceil(5/4)
    # The next step must see only the kept history, across block boundaries.
    _check_step(adapter, reference, ["b", "a"], [[30, 31], [40, 0]], [2, 1])
    adapter.release(["a", "b"])
    assert pool.num_free_blocks == free0


def test_score_and_heads_are_consistent(pair) -> None:
    adapter, _ = pair
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.inference_mode():
        out = adapter.score(ids, [1])
        # Features of the last layer, through the final norm and head, are the logits.
        torch.testing.assert_close(adapter.lm_head(out.features), out.logits, atol=1e-5, rtol=1e-5)
        assert adapter.embed(ids).shape == (1, 4, adapter.hidden_size)
    assert out.logits.shape == (1, 4, adapter.vocab_size)


@pytest.mark.parametrize("bf16_exact", [False, True], ids=["fp32", "bf16-exact"])
@pytest.mark.parametrize("rows", [1, 5, 40])
def test_head_rows_equal_the_full_head_at_those_rows(pair, bf16_exact: bool, rows: int) -> None:
    adapter, _ = pair
    assert isinstance(adapter, SupportsLmHeadRows)
    if bf16_exact:  # the compiled bf16-panel product then serves up to 32 rows
        with torch.no_grad():
            w = adapter.model.lm_head_weight
            w.copy_(w.to(torch.bfloat16).float())
    ids = torch.tensor([17, 2, 63, 0, 40, 9, 2 * 16 + 1])
    head = adapter.lm_head_rows(ids)
    hidden = torch.randn(rows, adapter.hidden_size, generator=torch.Generator().manual_seed(rows))
    with torch.inference_mode():
        want = adapter.lm_head(hidden)[:, ids]
        got = head(hidden)
    assert got.shape == (rows, ids.numel()) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="token_ids"):
        adapter.lm_head_rows(torch.tensor([adapter.vocab_size]))


def test_invalid_calls_raise(pair) -> None:
    adapter, _ = pair
    with pytest.raises(ValueError, match="input_lens"):
        adapter.extend(["a"], torch.tensor([[1, 2]]), torch.tensor([3]), LAYERS)
    with pytest.raises(ValueError, match="distinct"):
        adapter.extend(["a", "a"], torch.tensor([[1], [2]]), torch.tensor([1, 1]), LAYERS)
    adapter.extend(["a"], torch.tensor([[1, 2]]), torch.tensor([2]), LAYERS)
    with pytest.raises(ValueError, match="lengths"):
        adapter.truncate(["a"], torch.tensor([3]))
    with pytest.raises(ValueError, match="layer_id"):
        adapter.layer_state_dict(2)
