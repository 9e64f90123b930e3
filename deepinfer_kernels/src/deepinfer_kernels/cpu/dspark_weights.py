"""The DSpark drafter's weights as plain tensors, what :mod:`deepinfer_kernels.cpu.dspark_draft`
packs and its torch references read (this package knows nothing of ``deepinfer_spec``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer_kernels.quant.formats import QuantWeight

__all__ = ["DraftBlockWeights", "DraftContextWeights", "DraftLayerWeights"]


@dataclass(frozen=True)
class DraftLayerWeights:
    """One backbone layer: norms ``[H]``; ``qkv [(hq + 2 hkv) d, H]`` (queries, keys, values
    stacked), ``o [H, hq d]``, ``gate_up [2 I, H]`` (gate then up), ``down [H, I]``."""

    input_norm: torch.Tensor
    qkv: torch.Tensor
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


@dataclass(frozen=True)
class DraftBlockWeights:
    """What a greedy proposal reads (fp32 CPU tensors unless said otherwise).

    ``mask_embed [G-1, H]``; ``layers``; ``rope_cos``/``rope_sin [W + G, d/2]``, the rotation
    of relative positions ``-W .. G-1``; ``head_norm [H]``/``head_eps``: the target's final
    norm; ``head_rows``: the target's head rows of the draft vocabulary (any GGUF format);
    ``markov_in [vocab, r]`` (W1), ``markov_out [V, r]`` (W2); ``vocab_ids [V]`` int64 (draft
    index -> token id) or ``None`` (the identity); ``conf_w [H + r]``, ``conf_b``.
    """

    mask_embed: torch.Tensor
    layers: tuple[DraftLayerWeights, ...]
    num_heads: int
    num_kv_heads: int
    eps: float
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor
    head_norm: torch.Tensor
    head_eps: float
    head_rows: QuantWeight
    markov_in: torch.Tensor
    markov_out: torch.Tensor
    vocab_ids: torch.Tensor | None
    conf_w: torch.Tensor
    conf_b: float

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError("layers: expected at least one backbone layer")
        hidden = int(self.mask_embed.shape[-1])
        if self.num_heads % self.num_kv_heads or hidden % self.num_heads:
            raise ValueError(
                f"num_heads: {self.num_heads} heads of {hidden} must group into "
                f"num_kv_heads={self.num_kv_heads}"
            )
        if self.head_rows.cols != hidden:
            raise ValueError(f"head_rows: expected {hidden} columns, got {self.head_rows.cols}")
        if self.markov_out.shape[0] != self.head_rows.rows:
            raise ValueError(
                f"markov_out: expected {self.head_rows.rows} rows (one per head row), "
                f"got {tuple(self.markov_out.shape)}"
            )
        if self.vocab_ids is not None and tuple(self.vocab_ids.shape) != (self.head_rows.rows,):
            raise ValueError(f"vocab_ids: expected [{self.head_rows.rows}]")
        if len({tuple(layer.down.shape) for layer in self.layers}) != 1:
            raise ValueError("layers: expected every backbone layer to have the same shapes")

    @property
    def hidden_size(self) -> int:
        return int(self.mask_embed.shape[-1])

    @property
    def gamma(self) -> int:
        return int(self.mask_embed.shape[0]) + 1

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def intermediate_size(self) -> int:
        return int(self.layers[0].down.shape[1])

    @property
    def window(self) -> int:
        return int(self.rope_cos.shape[0]) - self.gamma


@dataclass(frozen=True)
class DraftContextWeights:
    """The projection of raw target features ``[T, F]`` into context entries: standardise
    (``shift``, ``scale [F]``), ``proj [H, F]``, RMSNorm (``norm [H]``, ``eps``), then every
    layer's keys and values ``kv [L * 2 * kv_dim, H]`` (layer 0's keys, its values, ...)."""

    shift: torch.Tensor
    scale: torch.Tensor
    proj: torch.Tensor
    norm: torch.Tensor
    eps: float
    kv: torch.Tensor
