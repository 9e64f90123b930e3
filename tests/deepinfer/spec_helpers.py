"""Drafters built at test time for the engine's DSpark tests."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict

import torch

from deepinfer.models import KVPool, LlamaModel
from deepinfer.models.spec_adapter import LlamaTargetAdapter
from deepinfer_spec import DSparkConfig, DSparkDrafter


def oracle_drafter(
    model: LlamaModel, outputs: list[list[int]], seed: int = 0, window: int = 8
) -> DSparkDrafter:
    """A drafter whose Markov bias predicts the most frequent successor seen in ``outputs``:
    its drafts are often (not always) the target's greedy tokens."""
    cfg = model.config
    target = LlamaTargetAdapter(model, KVPool.for_model(cfg, num_blocks=4, block_size=4))
    torch.manual_seed(seed)
    drafter = DSparkDrafter(
        DSparkConfig(
            target_layer_ids=(0, 1),
            gamma=4,
            window=window,
            markov_rank=cfg.vocab_size,
            num_heads=4,
        ),
        target,
    )
    succ: dict[int, Counter[int]] = defaultdict(Counter)
    for seq in outputs:
        for a, b in itertools.pairwise(seq):
            succ[a][b] += 1
    with torch.no_grad():
        drafter.markov_in.weight.copy_(torch.eye(cfg.vocab_size))
        drafter.markov_out.weight.zero_()
        for a, counter in succ.items():
            drafter.markov_out.weight[counter.most_common(1)[0][0], a] = 60.0
    return drafter.eval()
