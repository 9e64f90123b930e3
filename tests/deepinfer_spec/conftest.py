"""Fixtures for the deepinfer_spec tests: a tiny random target and drafters over it."""

from __future__ import annotations

import pytest
import torch

from deepinfer_spec import DSparkConfig, DSparkDrafter, RecomputeTarget
from deepinfer_spec.testing import TinyTarget


class RaggedScheduler:
    """Test double for a VerifyScheduler: verify while the running product of confidences
    stays above ``threshold`` (a prefix rule), capped per row by ``cap`` to force ragged rows."""

    def __init__(self, threshold: float = 0.0, cap: list[int] | None = None) -> None:
        self.threshold, self.cap = threshold, cap

    def schedule(self, confidence: torch.Tensor) -> torch.Tensor:
        survive = torch.cumprod(confidence, dim=1) >= self.threshold
        n = torch.cumprod(survive.to(torch.int64), dim=1).sum(dim=1)
        if self.cap is not None:
            caps = torch.tensor(self.cap, dtype=torch.int64)
            n = torch.minimum(n, caps[torch.arange(n.shape[0]) % caps.numel()])
        return n


@pytest.fixture
def tiny_model() -> TinyTarget:
    return TinyTarget(vocab_size=32, hidden_size=32, num_layers=2, seed=0)


@pytest.fixture
def target(tiny_model: TinyTarget) -> RecomputeTarget:
    return RecomputeTarget(tiny_model)


def make_drafter(
    target: RecomputeTarget, seed: int = 0, dtype: torch.dtype = torch.float32, **overrides: object
) -> DSparkDrafter:
    kwargs: dict[str, object] = {
        "target_layer_ids": (0, 1),
        "gamma": 4,
        "window": 8,
        "num_layers": 1,
        "markov_rank": 8,
        "num_heads": 4,
    }
    kwargs.update(overrides)
    torch.manual_seed(seed)
    drafter = DSparkDrafter(DSparkConfig(**kwargs), target)  # type: ignore[arg-type]
    with torch.no_grad():
        # An "untrained" drafter with a non-zero Markov bias, so every head is exercised.
        drafter.markov_out.weight.normal_(0.0, 0.5)
    return drafter.to(dtype).eval()


@pytest.fixture(autouse=True)
def _one_torch_thread() -> object:
    """These tensors are tiny: intra-op threads only add contention on a shared CI machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
