"""The drafter's greedy block as one compiled call: same drafts as its modules, lossless."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels.quant.formats import QuantType, QuantWeight
from deepinfer_spec import (
    DSparkConfig,
    DSparkDrafter,
    FixedGammaScheduler,
    LazyContext,
    NativeDraft,
    RecomputeTarget,
    SpecDecoder,
    native_draft_kernel,
    propose,
)
from deepinfer_spec.testing import TinyTarget


def _drafter(seed: int, *, kv_heads: int = 2, shortlist: bool = False) -> tuple[
    DSparkDrafter, TinyTarget
]:  # fmt: skip
    model = TinyTarget(vocab_size=64, hidden_size=32, num_layers=2, seed=seed)
    config = DSparkConfig(
        target_layer_ids=(0, 1), gamma=4, window=8, markov_rank=8, num_heads=4,
        num_kv_heads=kv_heads, rms_norm_eps=1e-5,
    )  # fmt: skip
    drafter = DSparkDrafter(config, RecomputeTarget(model)).eval()
    gen = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for p in drafter.parameters():  # a trained-looking drafter saved in bf16
            p.copy_((torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5).bfloat16().float())
        drafter.fit_feature_stats(torch.randn(50, drafter.feature_dim, generator=gen) * 3 + 1)
    if shortlist:
        drafter = drafter.restrict_vocab(torch.randperm(64, generator=gen)[:40]).eval()
    return drafter, model


class _Counting:
    """A NativeDraft that counts its calls (so a test knows the compiled path ran)."""

    def __init__(self, kernel: NativeDraft) -> None:
        self.kernel, self.greedy_calls, self.context_calls = kernel, 0, 0

    def greedy(self, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
        self.greedy_calls += 1
        return self.kernel.greedy(*args)

    def context_kv(self, features: torch.Tensor) -> torch.Tensor:
        self.context_calls += 1
        return self.kernel.context_kv(features)


def _native(drafter: DSparkDrafter, model: TinyTarget) -> _Counting:
    ids = drafter.draft_vocab_ids
    rows = model.head.weight.detach()[ids if ids is not None else slice(None)].contiguous()
    head = QuantWeight(rows.view(torch.uint8), QuantType.F32, int(rows.shape[1]))
    kernel = native_draft_kernel(drafter, head, model.norm.weight, model.norm.eps)
    if kernel is None:
        pytest.skip("compiled kernels unavailable here")
    counting = _Counting(kernel)
    drafter.use_native(counting)
    return counting


@settings(max_examples=10, deadline=None)
@given(
    seed=st.integers(0, 2**10),
    kv_heads=st.sampled_from([1, 2, 4]),
    shortlist=st.booleans(),
    batch=st.integers(1, 3),
    num_tokens=st.sampled_from([None, 1, 3]),
    padded=st.booleans(),
)
def test_native_proposal_equals_the_modules(
    seed: int, kv_heads: int, shortlist: bool, batch: int, num_tokens: int | None, padded: bool
) -> None:
    drafter, model = _drafter(seed, kv_heads=kv_heads, shortlist=shortlist)
    gen = torch.Generator().manual_seed(seed)
    context = torch.randn(batch, 8, drafter.context_kv_dim, generator=gen)
    valid = torch.ones(batch, 8, dtype=torch.bool)
    if padded:
        valid[0, :5] = False
    anchors = torch.randint(0, 64, (batch,), generator=gen)
    kwargs = dict(temperature=0.0, context_is_kv=True, num_tokens=num_tokens)
    ref = propose(drafter, anchors, context, valid, **kwargs)  # type: ignore[arg-type]
    counting = _native(drafter, model)
    got = propose(drafter, anchors, context, valid, **kwargs)  # type: ignore[arg-type]
    assert counting.greedy_calls == 1
    assert torch.equal(got.token_ids, ref.token_ids)
    torch.testing.assert_close(got.confidence, ref.confidence, rtol=1e-5, atol=1e-5)
    assert torch.equal(got.probs, ref.probs)  # one-hot over the whole vocabulary


def test_sampled_and_hooked_rows_keep_the_modules() -> None:
    drafter, model = _drafter(1)
    counting = _native(drafter, model)
    context = torch.randn(1, 8, drafter.context_kv_dim)
    valid = torch.ones(1, 8, dtype=torch.bool)
    calls: list[int] = []

    def hook(k: int, prefix: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        calls.append(k)
        return logits

    propose(drafter, torch.tensor([3]), context, valid, temperature=0.0, context_is_kv=True,
            logits_hook=hook)  # fmt: skip
    assert calls == [0, 1, 2, 3]  # the hook saw every position: the modules ran
    sampled = propose(drafter, torch.tensor([3]), context, valid, temperature=1.0,
                      context_is_kv=True, generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert not torch.equal(sampled.probs, (sampled.probs > 0).float())  # not one-hot
    assert counting.greedy_calls == 0


def test_context_entries_equal_the_modules() -> None:
    drafter, model = _drafter(2)
    features = torch.randn(5, drafter.feature_dim) * 4
    ref = drafter.context_kv(drafter.project_context(features))
    _native(drafter, model)
    assert drafter.native is not None
    torch.testing.assert_close(drafter.native.context_kv(features), ref, rtol=1e-4, atol=1e-4)
    lazy = LazyContext(drafter, max_seqs=2)
    lazy.catch_up("a", 0)
    lazy.push("a", features)
    entries, valid = lazy.view(["a"])
    torch.testing.assert_close(entries[0, -5:], ref, rtol=1e-4, atol=1e-4)
    assert valid[0].tolist() == [False] * 3 + [True] * 5


@pytest.mark.parametrize("shortlist", [False, True])
def test_greedy_decoding_with_the_native_block_is_lossless(shortlist: bool) -> None:
    drafter, model = _drafter(3, shortlist=shortlist)
    counting = _native(drafter, model)
    decoder = SpecDecoder(drafter, RecomputeTarget(model), FixedGammaScheduler(3), temperature=0.0)
    prompts = [[1, 2, 3, 4, 5], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11, 12]]
    out = decoder.generate(prompts, max_new_tokens=12)
    assert out == [model.greedy(p, 12) for p in prompts]
    assert counting.greedy_calls > 0 and counting.context_calls > 0


def test_weights_that_are_not_bf16_values_get_no_kernel() -> None:
    drafter, model = _drafter(4)
    with torch.no_grad():
        drafter.layers[0].o_proj.weight.add_(1e-3)  # type: ignore[operator, union-attr]
    head = QuantWeight(model.head.weight.detach().contiguous().view(torch.uint8), QuantType.F32, 32)
    assert native_draft_kernel(drafter, head, model.norm.weight, model.norm.eps) is None
    with pytest.raises(ValueError, match="head_rows"):
        native_draft_kernel(drafter, QuantWeight(head.data[:10], QuantType.F32, 32),
                            model.norm.weight, model.norm.eps)  # fmt: skip
    with pytest.raises(TypeError, match="kernel"):
        drafter.use_native(object())  # type: ignore[arg-type]
