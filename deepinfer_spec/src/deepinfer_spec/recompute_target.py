"""A :class:`TargetAdapter` for any :class:`ScoringTarget`, by recomputation.

It keeps each sequence's token ids and re-runs :meth:`ScoringTarget.score` over the whole
history on every ``extend``. That is exact and needs nothing from the model but a causal
forward, which makes it the reference adapter (tests, small experiments, models without a KV
cache); an engine with a KV cache implements :class:`TargetAdapter` directly instead.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from deepinfer_spec.adapter import ScoringTarget, TargetOutput


class RecomputeTarget:
    """Stateful wrapper around a stateless scoring target (O(context) work per step)."""

    def __init__(self, model: ScoringTarget, pad_id: int = 0) -> None:
        self.model = model
        self.pad_id = pad_id
        self._tokens: dict[Hashable, list[int]] = {}

    @property
    def hidden_size(self) -> int:
        return self.model.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    @property
    def num_layers(self) -> int:
        return self.model.num_layers

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed(token_ids)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(hidden)

    def score(self, input_ids: torch.Tensor, layer_ids: Sequence[int]) -> TargetOutput:
        return self.model.score(input_ids, layer_ids)

    def length(self, seq_id: Hashable) -> int:
        return len(self._tokens.get(seq_id, ()))

    def extend(
        self,
        seq_ids: Sequence[Hashable],
        input_ids: torch.Tensor,
        input_lens: torch.Tensor,
        layer_ids: Sequence[int],
    ) -> TargetOutput:
        batch, width = input_ids.shape
        if len(seq_ids) != batch or tuple(input_lens.shape) != (batch,):
            raise ValueError(
                f"seq_ids/input_lens: expected {batch} entries matching input_ids, "
                f"got {len(seq_ids)} and {tuple(input_lens.shape)}"
            )
        lens = [int(n) for n in input_lens.tolist()]
        if any(n < 1 or n > width for n in lens):
            raise ValueError(f"input_lens: expected values in [1, {width}], got {lens}")
        histories = []
        for sid, row, n in zip(seq_ids, input_ids.tolist(), lens):
            hist = self._tokens.setdefault(sid, [])
            hist.extend(row[:n])
            histories.append(hist)
        total = max(len(h) for h in histories)
        full = torch.full((batch, total), self.pad_id, dtype=torch.int64, device=input_ids.device)
        for b, hist in enumerate(histories):
            full[b, : len(hist)] = torch.tensor(hist, dtype=torch.int64)
        # Right padding is invisible to earlier positions under a causal mask.
        out = self.model.score(full, layer_ids)
        starts = torch.tensor([len(h) - n for h, n in zip(histories, lens)], device=full.device)
        idx = (starts[:, None] + torch.arange(width, device=full.device)[None]).clamp(max=total - 1)
        rows = torch.arange(batch, device=full.device)[:, None]
        return TargetOutput(logits=out.logits[rows, idx], features=out.features[rows, idx])

    def truncate(self, seq_ids: Sequence[Hashable], lengths: torch.Tensor) -> None:
        for sid, n in zip(seq_ids, lengths.tolist()):
            hist = self._tokens[sid]
            if n < 0 or n > len(hist):
                raise ValueError(f"lengths: {n} is outside [0, {len(hist)}] for sequence {sid!r}")
            del hist[int(n) :]

    def release(self, seq_ids: Sequence[Hashable]) -> None:
        for sid in seq_ids:
            self._tokens.pop(sid, None)

    def layer_state_dict(self, layer_id: int) -> dict[str, torch.Tensor]:
        """Forwards to the wrapped model (see ``SupportsLayerWeights``)."""
        fn = getattr(self.model, "layer_state_dict", None)
        if fn is None:
            raise TypeError("model: does not implement layer_state_dict(layer_id)")
        result: dict[str, torch.Tensor] = fn(layer_id)
        return result
