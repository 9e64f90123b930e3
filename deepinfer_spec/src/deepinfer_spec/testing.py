"""Test helpers for code that uses deepinfer_spec: a tiny random target model.

`TinyTarget` is a Llama-style causal transformer implementing the ``ScoringTarget`` protocol,
deterministic given its seed; the package's tests and benchmarks train and run drafters against
it, and ``deepinfer-spec --target deepinfer_spec.testing:make_target`` uses it from the CLI.

Example::

    from deepinfer_spec.testing import TinyTarget

    target = TinyTarget(vocab_size=32, hidden_size=32, num_layers=2, seed=0)
    print(target.greedy([1, 2, 3], max_new_tokens=4))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from deepinfer_spec import RecomputeTarget, TargetOutput
from deepinfer_spec.layers import DraftLayer, RMSNorm, RopeTables

__all__ = ["TinyTarget", "make_target"]


class _Layer(DraftLayer):
    """A causal decoder layer: the draft layer with an empty context and a causal mask."""

    def causal(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        pos = torch.arange(t, device=x.device)
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device))[None, None]
        empty = x.new_zeros(x.shape[0], 0, x.shape[2])
        out: torch.Tensor = self(x, empty, mask, RopeTables.at(pos, pos, self.head_dim, self.theta))
        return out


class TinyTarget(nn.Module):
    """Random causal LM: embedding, ``num_layers`` layers, final RMSNorm, untied LM head."""

    def __init__(
        self,
        vocab_size: int = 32,
        hidden_size: int = 32,
        num_layers: int = 2,
        num_heads: int = 4,
        logit_scale: float = 4.0,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self._vocab, self._hidden, self._layers_n = vocab_size, hidden_size, num_layers
        self.tok = nn.Embedding(vocab_size, hidden_size)
        self.layers = nn.ModuleList(
            _Layer(hidden_size, num_heads, num_heads, 2 * hidden_size, 1e-6, 10000.0)
            for _ in range(num_layers)
        )
        self.norm = RMSNorm(hidden_size)
        self.head = nn.Linear(hidden_size, vocab_size, bias=False)
        with torch.no_grad():
            for p in self.parameters():
                if p.ndim == 2:
                    p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
            self.tok.weight.copy_(torch.randn(self.tok.weight.shape, generator=gen))
            self.head.weight.mul_(logit_scale)
        self.to(dtype)
        self.requires_grad_(False)
        self.eval()

    @property
    def hidden_size(self) -> int:
        return self._hidden

    @property
    def vocab_size(self) -> int:
        return self._vocab

    @property
    def num_layers(self) -> int:
        return self._layers_n

    @property
    def dtype(self) -> torch.dtype:
        return self.tok.weight.dtype

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.tok(token_ids)
        return out

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.norm(hidden.to(self.dtype)))
        return out

    def score(self, input_ids: torch.Tensor, layer_ids: Sequence[int]) -> TargetOutput:
        x = self.tok(input_ids)
        feats = []
        for layer in self.layers:
            x = cast(_Layer, layer).causal(x)
            feats.append(x)
        features = torch.cat([feats[i] for i in layer_ids], dim=-1)
        return TargetOutput(logits=self.lm_head(x), features=features)

    def layer_state_dict(self, layer_id: int) -> dict[str, torch.Tensor]:
        return dict(self.layers[layer_id].state_dict())

    @torch.no_grad()
    def greedy(self, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
        """Plain greedy decoding by recomputation (the reference for speculative greedy)."""
        ids = list(prompt)
        for _ in range(max_new_tokens):
            logits = self.score(torch.tensor([ids]), [0]).logits[0, -1]
            ids.append(int(torch.argmax(logits)))
        return ids[len(prompt) :]

    @torch.no_grad()
    def sample(
        self, batch: int, length: int, generator: torch.Generator, temperature: float = 1.0
    ) -> torch.Tensor:
        """``[batch, length]`` sequences sampled from the model (first token uniform)."""
        ids = torch.randint(0, self._vocab, (batch, 1), generator=generator)
        for _ in range(length - 1):
            logits = self.score(ids, [0]).logits[:, -1].float()
            p = F.softmax(logits / temperature, dim=-1)
            ids = torch.cat((ids, torch.multinomial(p, 1, generator=generator)), dim=1)
        return ids


def make_target(**kwargs: object) -> RecomputeTarget:
    """Target factory for the CLI (``--target deepinfer_spec.testing:make_target``)."""
    return RecomputeTarget(TinyTarget(**kwargs))  # type: ignore[arg-type]
