"""Configuration of a DSpark drafter.

The drafter's hidden size and vocabulary come from the target (it shares the target's embedding
and LM head), so they are not part of the config; everything here is validated on construction.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

SequentialHead = Literal["markov", "rnn"]
_SEQUENTIAL_HEADS = ("markov", "rnn")


@dataclass(frozen=True)
class DSparkConfig:
    """Shape of a DSpark drafter.

    Args:
        target_layer_ids: indices (0-based, into the target's decoder layers) whose output hidden
            states are concatenated into the context features; at least one, no duplicates.
        gamma: draft block size (tokens proposed per step).
        window: number of most recent target positions the drafter attends to.
        num_layers: transformer layers in the parallel backbone.
        markov_rank: rank ``r`` of the Markov bias ``W1[x_{k-1}] @ W2``.
        sequential_head: ``"markov"`` (bias from the previous token only) or ``"rnn"`` (a tanh
            recurrence over the low-rank token codes of the block so far).
        num_heads: attention heads of the backbone (``hidden_size % num_heads == 0``).
        num_kv_heads: key/value heads (grouped-query attention); ``None`` means ``num_heads``.
        intermediate_size: SwiGLU width of the backbone MLP; ``None`` means ``4 * hidden_size``.
        rope_theta: RoPE base; positions are relative to the anchor token.
        rms_norm_eps: epsilon of every RMSNorm in the drafter.
        draft_vocab_size: draft only among this many token ids (a frequency shortlist, see
            :meth:`DSparkDrafter.restrict_vocab`); ``None`` drafts over the whole vocabulary.
            The LM head and the Markov head's output then cost ``draft_vocab_size / vocab``
            of the full ones; a token outside the shortlist is never drafted (the target still
            emits it as a correction or bonus token).
    """

    target_layer_ids: tuple[int, ...]
    gamma: int = 5
    window: int = 128
    num_layers: int = 1
    markov_rank: int = 256
    sequential_head: SequentialHead = "markov"
    num_heads: int = 4
    num_kv_heads: int | None = None
    intermediate_size: int | None = None
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    draft_vocab_size: int | None = None

    def __post_init__(self) -> None:
        ids = self.target_layer_ids
        if isinstance(ids, list):
            object.__setattr__(self, "target_layer_ids", tuple(ids))
            ids = self.target_layer_ids
        if not isinstance(ids, tuple) or not ids:
            raise ValueError(
                f"target_layer_ids: expected a non-empty tuple of layer indices, got {ids!r}"
            )
        if any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in ids):
            raise ValueError(f"target_layer_ids: expected non-negative ints, got {ids!r}")
        if len(set(ids)) != len(ids):
            raise ValueError(f"target_layer_ids: duplicates are not allowed, got {ids!r}")
        for name in ("gamma", "window", "num_layers", "markov_rank", "num_heads"):
            _check_positive_int(name, getattr(self, name))
        if self.num_kv_heads is not None:
            _check_positive_int("num_kv_heads", self.num_kv_heads)
            if self.num_heads % self.num_kv_heads:
                raise ValueError(
                    f"num_kv_heads: must divide num_heads={self.num_heads}, got {self.num_kv_heads}"
                )
        if self.intermediate_size is not None:
            _check_positive_int("intermediate_size", self.intermediate_size)
        if self.draft_vocab_size is not None:
            _check_positive_int("draft_vocab_size", self.draft_vocab_size)
        if self.sequential_head not in _SEQUENTIAL_HEADS:
            raise ValueError(
                f"sequential_head: expected one of {_SEQUENTIAL_HEADS}, got {self.sequential_head!r}"
            )
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta: expected > 0, got {self.rope_theta}")
        if not 0 < self.rms_norm_eps < 1:
            raise ValueError(f"rms_norm_eps: expected in (0, 1), got {self.rms_norm_eps}")

    @property
    def kv_heads(self) -> int:
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; ``DSparkConfig.from_dict`` inverts it."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["target_layer_ids"] = list(self.target_layer_ids)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DSparkConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"data: unknown DSparkConfig fields {sorted(unknown)}")
        kwargs = dict(data)
        if "target_layer_ids" in kwargs:
            kwargs["target_layer_ids"] = tuple(kwargs["target_layer_ids"])
        return cls(**kwargs)


def _check_positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")
