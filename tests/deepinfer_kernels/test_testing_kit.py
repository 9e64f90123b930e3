"""The testing kit as a product: profiles reach past tile sizes, failures print the layout,
and the statistical checkers catch broken verifiers and samplers (#23 item 9)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings

import deepinfer_kernels as dk
from deepinfer_kernels.testing import (
    PROFILES,
    PagedLayout,
    materialize,
    paged_attention_cases,
    paged_layouts,
    resolve_profile,
)
from deepinfer_kernels.testing.stats import (
    assert_distribution,
    check_lossless,
    check_sampler,
    chi_square_p_value,
)

SEEN: dict[str, set[int]] = {"head_dims": set(), "block_sizes": set()}


@settings(max_examples=60, deadline=None, database=None)
@given(layout=paged_layouts(profile="thorough"))
def test_thorough_profile_draws_valid_layouts(layout: PagedLayout) -> None:
    assert len(layout.q_lens) == len(layout.seq_lens) == len(layout.block_table)
    for m, n, row in zip(layout.q_lens, layout.seq_lens, layout.block_table):
        assert 0 <= m <= n <= 320
        used = -(-n // layout.block_size)
        assert all(0 <= b < layout.num_blocks for b in row[:used])
        assert all(b == -1 for b in row[used:])
    SEEN["head_dims"].add(layout.head_dim)
    SEEN["block_sizes"].add(layout.block_size)


def test_thorough_profile_reaches_past_tiles() -> None:
    sizes = PROFILES["thorough"]
    assert sizes["max_seq_len"] > 256 and 64 in sizes["block_sizes"]
    assert {80, 96, 192, 256} <= set(sizes["head_dims"]) and "empty" in sizes["kinds"]
    assert sizes["max_window"] > 256
    # The repository's suite runs on quick sizes (tests/conftest.py sets the variable).
    assert resolve_profile(None) is PROFILES["quick"]
    with pytest.raises(ValueError, match="profile"):
        resolve_profile("huge")


def test_failing_case_prints_layout_and_seed_not_tensors() -> None:
    layout = PagedLayout(
        q_lens=(0, 3), seq_lens=(5, 7), block_size=4, num_blocks=4,
        block_table=((2, 0), (1, 3)), num_q_heads=2, num_kv_heads=1, head_dim=8,
    )  # fmt: skip
    case = materialize(layout, seed=42, sliding_window=3)
    text = repr(case)
    assert "seed=42" in text and "q_lens=(0, 3)" in text and "q=(3, 2, 8)" in text
    assert "tensor(" not in text and len(text) < 600


def test_empty_queries_run_on_both_paths() -> None:
    layout = PagedLayout(
        q_lens=(0, 2, 0), seq_lens=(5, 7, 0), block_size=4, num_blocks=5,
        block_table=((4, 0), (1, 3), (-1, -1)), num_q_heads=2, num_kv_heads=1, head_dim=8,
    )  # fmt: skip
    case = materialize(layout, seed=1)
    a = dk.paged_attention(*case.tensors(), use_triton=False)
    b = dk.paged_attention(*case.tensors(), use_triton=True)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@settings(max_examples=3, deadline=None)
@given(case=paged_attention_cases(profile="quick", kinds=("decode", "empty")))
def test_quick_cases_with_empty_kind(case) -> None:  # type: ignore[no-untyped-def]
    assert case.layout is not None and case.seed is not None
    assert case.q.shape[0] == sum(case.layout.q_lens)


def test_chi_square_support_and_power() -> None:
    probs = torch.tensor([0.5, 0.25, 0.25, 0.0])
    gen = torch.Generator().manual_seed(0)
    good = torch.multinomial(probs, 4000, replacement=True, generator=gen)
    assert chi_square_p_value(good, probs) > 1e-3
    with pytest.raises(AssertionError, match="zero-probability"):
        chi_square_p_value(torch.tensor([0, 3]), probs)
    skewed = torch.multinomial(torch.tensor([0.6, 0.2, 0.2, 0.0]), 4000, True, generator=gen)
    with pytest.raises(AssertionError, match="p-value"):
        assert_distribution(skewed, probs)


def draws_from_target_on_reject(ids, p_d, p_t, n, generator=None):  # type: ignore[no-untyped-def]
    """A rejection sampler with the classic bug: after a rejection it draws the correction from
    ``p_t`` instead of the residual ``max(0, p_t - p_d)``."""
    batch, gamma = ids.shape
    k = torch.arange(gamma)
    safe = ids.clamp(min=0)[..., None]
    pt, pd = p_t[:, :gamma].gather(-1, safe)[..., 0], p_d.gather(-1, safe)[..., 0]
    u = torch.rand(batch, gamma, generator=generator)
    ok = (k[None] < n[:, None]) & (u * pd < pt)
    acc = torch.cumprod(ok.long(), 1).sum(1)
    tok = torch.multinomial(p_t[torch.arange(batch), acc], 1, generator=generator)[:, 0]
    out = torch.cat([torch.where(k[None] < acc[:, None], ids, -1), torch.full((batch, 1), -1)], 1)
    out[torch.arange(batch), acc] = tok
    return SimpleNamespace(output_ids=out)


def test_check_lossless_passes_the_real_verifier_and_catches_a_lossy_one() -> None:
    assert check_lossless(dk.speculative_verify, trials=8000) > 1e-3
    with pytest.raises(AssertionError, match="not distributed as the target"):
        check_lossless(draws_from_target_on_reject, trials=8000)


def test_check_lossless_reports_a_powerless_run() -> None:
    with pytest.raises(AssertionError, match="negative control"):
        check_lossless(dk.speculative_verify, trials=20)


def test_check_sampler_passes_sample_and_catches_a_dropped_filter() -> None:
    assert check_sampler(dk.sample, top_k=6, top_p=0.8, trials=8000) > 1e-3
    assert check_sampler(dk.sample, min_p=0.1, temperature=0.7, trials=8000) > 1e-3

    def forgets_top_p(logits, temperature, top_k, top_p, min_p, generator=None):  # type: ignore[no-untyped-def]
        return dk.sample(
            logits, temperature, top_k, torch.ones_like(top_p), min_p, generator=generator
        )

    with pytest.raises(AssertionError, match="outside the kept support"):
        check_sampler(forgets_top_p, top_k=6, top_p=0.5, trials=8000)
