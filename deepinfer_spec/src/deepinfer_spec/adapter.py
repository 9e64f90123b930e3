"""The seam between a target model and the DSpark drafter.

An engine makes its model usable by the drafter by implementing :class:`TargetAdapter`. The
contract is written for an engine with a paged KV cache: the target already holds each
sequence's KV, so one speculative step costs one :meth:`TargetAdapter.extend` (the target forward
over the anchor and the verified drafts, returning logits *and* the hidden states of the chosen
layers for exactly those tokens) and one :meth:`TargetAdapter.truncate` (dropping the KV of
rejected drafts). Nothing is ever recomputed over the whole context. See docs/spec.md.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class TargetOutput:
    """What the target returns for the tokens it just processed.

    Attributes:
        logits: ``[B, T, V]``; ``logits[b, t]`` is the next-token distribution after token ``t``.
        features: ``[B, T, len(layer_ids) * hidden_size]``: for each token, the output hidden
            states (residual stream after the decoder layer) of the requested layers,
            concatenated in the order of ``layer_ids``.

    Rows past a sequence's ``input_lens`` are padding: their values are unspecified.
    """

    logits: torch.Tensor
    features: torch.Tensor


@runtime_checkable
class ScoringTarget(Protocol):
    """The stateless part of a target: enough for training and for :class:`RecomputeTarget`."""

    @property
    def hidden_size(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def num_layers(self) -> int: ...

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Input embedding ``[...] int64 -> [..., hidden_size]`` (frozen, shared with the drafter)."""
        ...

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[..., hidden_size] -> [..., vocab_size]`` logits, *including the target's final
        norm*: ``lm_head(h) = W_out @ final_norm(h)`` (frozen, shared with the drafter)."""
        ...

    def score(self, input_ids: torch.Tensor, layer_ids: Sequence[int]) -> TargetOutput:
        """Plain causal forward over whole sequences ``[B, T]`` (no cache, no state)."""
        ...


@runtime_checkable
class TargetAdapter(ScoringTarget, Protocol):
    """A target the :class:`~deepinfer_spec.SpecDecoder` can drive.

    Each sequence is named by a hashable ``seq_id`` and owns a KV history inside the adapter.
    The decoder only ever calls, per step, ``extend`` then ``truncate``; ``release`` at the end.
    """

    def extend(
        self,
        seq_ids: Sequence[Hashable],
        input_ids: torch.Tensor,
        input_lens: torch.Tensor,
        layer_ids: Sequence[int],
    ) -> TargetOutput:
        """Append ``input_ids[b, :input_lens[b]]`` to sequence ``seq_ids[b]`` and run the target.

        ``input_ids`` is ``[B, T]`` int64, right-padded (pad values are arbitrary valid ids);
        ``input_lens`` is ``[B]`` int64 in ``[1, T]``. An unknown ``seq_id`` starts a new, empty
        sequence. The new tokens attend causally to the sequence's whole history and to each
        other. Returns logits and features for the ``T`` input rows (see :class:`TargetOutput`).
        """
        ...

    def truncate(self, seq_ids: Sequence[Hashable], lengths: torch.Tensor) -> None:
        """Keep only the first ``lengths[b]`` tokens of each sequence's history (drops the KV of
        rejected drafts). ``lengths[b]`` never exceeds the current length."""
        ...

    def release(self, seq_ids: Sequence[Hashable]) -> None:
        """Forget these sequences and free their KV."""
        ...


def check_target_output(out: TargetOutput, batch: int, tokens: int, vocab: int, dim: int) -> None:
    """Raise ``ValueError`` when a target's output does not have the shapes the contract says."""
    if tuple(out.logits.shape) != (batch, tokens, vocab):
        raise ValueError(
            f"target logits: expected shape {(batch, tokens, vocab)}, got {tuple(out.logits.shape)}"
        )
    if tuple(out.features.shape) != (batch, tokens, dim):
        raise ValueError(
            f"target features: expected shape {(batch, tokens, dim)}, "
            f"got {tuple(out.features.shape)}"
        )


@runtime_checkable
class SupportsLayerWeights(Protocol):
    """Optional: lets the drafter initialise backbone layers from target layers.

    ``layer_state_dict(i)`` returns layer ``i``'s weights under Llama names: ``input_layernorm.
    weight``, ``q_proj.weight``, ``k_proj.weight``, ``v_proj.weight``, ``o_proj.weight``,
    ``post_attention_layernorm.weight``, ``gate_proj.weight``, ``up_proj.weight``,
    ``down_proj.weight`` (``nn.Linear`` layout ``[out, in]``).
    """

    def layer_state_dict(self, layer_id: int) -> dict[str, torch.Tensor]: ...


@runtime_checkable
class SupportsLmHeadRows(Protocol):
    """Optional: a head restricted to some vocabulary rows, for drafters with a draft vocabulary.

    ``lm_head_rows(token_ids)`` returns a function ``hidden [..., H] -> logits [..., len(ids)]``
    equal to ``lm_head(hidden)[..., token_ids]``, computed from those rows only (the target may
    keep a sliced copy of the rows for as long as the function lives). Without it, the drafter
    computes the full head and indexes it: the same values, none of the saving.
    """

    def lm_head_rows(self, token_ids: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]: ...
