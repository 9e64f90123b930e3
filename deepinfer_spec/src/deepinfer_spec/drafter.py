"""The DSpark drafter: parallel backbone with context injection, Markov and confidence heads.

One forward of the backbone turns ``[anchor ; mask_1 .. mask_{G-1}]`` into hidden states
``h_1 .. h_G``; base logits are ``U_k = lm_head(h_k)`` with the target's frozen LM head. Token
``k`` is then drawn left to right from ``softmax(U_k + W1[x_{k-1}] @ W2)`` (``x_0`` = anchor),
and the confidence that it survives verification is ``c_k = sigmoid(w . [h_k ; W1[x_{k-1}]])``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from torch import nn

from deepinfer_spec.adapter import ScoringTarget, SupportsLayerWeights
from deepinfer_spec.config import DSparkConfig
from deepinfer_spec.layers import DraftLayer, RMSNorm


class DSparkDrafter(nn.Module):
    """Drafter for ``target``; holds only its own weights (the target's are borrowed, frozen).

    Args:
        config: the drafter's shape.
        target: provides ``hidden_size``, ``vocab_size``, ``num_layers``, ``embed`` and
            ``lm_head``. It is referenced, not registered as a submodule, so it is never moved,
            trained or saved with the drafter.
    """

    def __init__(self, config: DSparkConfig, target: ScoringTarget) -> None:
        super().__init__()
        if not isinstance(config, DSparkConfig):
            raise TypeError(f"config: expected DSparkConfig, got {type(config).__name__}")
        hidden, vocab = int(target.hidden_size), int(target.vocab_size)
        bad = [i for i in config.target_layer_ids if i >= target.num_layers]
        if bad:
            raise ValueError(
                f"config.target_layer_ids: {bad} out of range for a target with "
                f"{target.num_layers} layers"
            )
        self.config = config
        self.hidden_size, self.vocab_size = hidden, vocab
        # A plain attribute, bypassing nn.Module registration on purpose (see class docstring).
        object.__setattr__(self, "_target", target)
        rank = config.markov_rank
        self.context_proj = nn.Linear(len(config.target_layer_ids) * hidden, hidden, bias=False)
        self.context_norm = RMSNorm(hidden, config.rms_norm_eps)
        self.mask_embed = nn.Parameter(torch.randn(config.gamma - 1, hidden) * 0.02)
        inter = config.intermediate_size or 4 * hidden
        self.layers = nn.ModuleList(
            DraftLayer(
                hidden,
                config.num_heads,
                config.kv_heads,
                inter,
                config.rms_norm_eps,
                config.rope_theta,
            )
            for _ in range(config.num_layers)
        )
        self.markov_in = nn.Embedding(vocab, rank)  # W1
        nn.init.normal_(self.markov_in.weight, std=rank**-0.5)
        self.markov_out = nn.Linear(rank, vocab, bias=False)  # W2
        # Zero W2: an untrained drafter's sequential bias is exactly zero.
        nn.init.zeros_(self.markov_out.weight)
        self.rnn = nn.Linear(rank, rank, bias=False) if config.sequential_head == "rnn" else None
        self.confidence_head = nn.Linear(hidden + rank, 1)

    @property
    def target(self) -> ScoringTarget:
        return cast(ScoringTarget, self.__dict__["_target"])

    @property
    def feature_dim(self) -> int:
        """Size of the raw target features (``len(target_layer_ids) * hidden_size``)."""
        return self.context_proj.in_features

    def project_context(self, features: torch.Tensor) -> torch.Tensor:
        """``RMSNorm(W_c @ features)``: ``[..., feature_dim] -> [..., hidden_size]``."""
        if features.shape[-1] != self.feature_dim:
            raise ValueError(
                f"features: expected last dimension {self.feature_dim} "
                f"(= {len(self.config.target_layer_ids)} layers x {self.hidden_size}), "
                f"got {tuple(features.shape)}"
            )
        out: torch.Tensor = self.context_norm(
            self.context_proj(features.to(self.context_proj.weight.dtype))
        )
        return out

    def backbone(
        self, anchor_ids: torch.Tensor, context: torch.Tensor, context_valid: torch.Tensor
    ) -> torch.Tensor:
        """Hidden states ``h [B, G, H]`` of the block, in one pass.

        ``anchor_ids [B]``; ``context [B, W, H]`` projected features of the ``W`` positions
        before the anchor, oldest first (``W`` <= ``window``); ``context_valid [B, W]`` bool.
        """
        batch = int(anchor_ids.shape[0])
        if anchor_ids.ndim != 1:
            raise ValueError(f"anchor_ids: expected [B], got {tuple(anchor_ids.shape)}")
        if context.ndim != 3 or context.shape[0] != batch or context.shape[2] != self.hidden_size:
            raise ValueError(
                f"context: expected [{batch}, W, {self.hidden_size}], got {tuple(context.shape)}"
            )
        width = int(context.shape[1])
        if width > self.config.window:
            raise ValueError(f"context: {width} positions exceed window={self.config.window}")
        if tuple(context_valid.shape) != (batch, width) or context_valid.dtype != torch.bool:
            raise ValueError(f"context_valid: expected bool [{batch}, {width}]")
        gamma = self.config.gamma
        dtype = self.mask_embed.dtype
        anchor = self.target.embed(anchor_ids).to(dtype)[:, None, :]
        x = torch.cat((anchor, self.mask_embed[None].expand(batch, -1, -1)), dim=1)
        dev = x.device
        q_pos = torch.arange(gamma, device=dev)
        k_pos = torch.cat((torch.arange(-width, 0, device=dev), q_pos))
        keys_valid = torch.cat(
            (context_valid, torch.ones(batch, gamma, dtype=torch.bool, device=dev)), 1
        )
        mask = keys_valid[:, None, None, :]
        context = context.to(dtype)
        for layer in self.layers:
            x = layer(x, context, mask, q_pos, k_pos)
        return x

    def base_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``U = lm_head(h)`` through the target's frozen head."""
        return self.target.lm_head(hidden)

    def sequential_step(
        self, prev_ids: torch.Tensor, code: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One left-to-right step of the sequential head.

        Returns ``(bias [B, V], code [B, r])``: with ``"markov"`` ``code = W1[x_{k-1}]``; with
        ``"rnn"`` ``code = tanh(W1[x_{k-1}] + R @ code_{k-1})`` (``code_0 = 0``); ``bias = code @ W2``.
        """
        e = self.markov_in(prev_ids)
        if self.rnn is not None:
            e = torch.tanh(e if code is None else e + self.rnn(code))
        return self.markov_out(e), e

    def confidence_logit(self, hidden: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
        """``w . [h_k ; code_k] + b``; the confidence is its sigmoid."""
        logit: torch.Tensor = self.confidence_head(torch.cat((hidden, code), dim=-1))
        return logit.squeeze(-1)

    def teacher_forced(
        self, hidden: torch.Tensor, prev_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``[B, G, V]`` (``U_k`` + sequential bias) and confidence logits ``[B, G]``
        with the previous tokens given (``prev_ids[:, 0]`` is the anchor). Used in training."""
        base = self.base_logits(hidden)
        logits, conf = [], []
        code: torch.Tensor | None = None
        for k in range(hidden.shape[1]):
            bias, code = self.sequential_step(prev_ids[:, k], code)
            logits.append(base[:, k].to(bias.dtype) + bias)
            conf.append(self.confidence_logit(hidden[:, k], code))
        return torch.stack(logits, 1), torch.stack(conf, 1)

    @torch.no_grad()
    def init_backbone_from_target(self, target_layer_ids: Sequence[int]) -> None:
        """Copy target layer ``target_layer_ids[i]`` into backbone layer ``i``.

        The target must implement ``layer_state_dict`` (:class:`SupportsLayerWeights`) with the
        backbone's parameter names and shapes (Llama naming).
        """
        if not isinstance(self.target, SupportsLayerWeights):
            raise TypeError("target: does not implement layer_state_dict(layer_id)")
        if len(target_layer_ids) > len(self.layers):
            raise ValueError(
                f"target_layer_ids: {len(target_layer_ids)} layers given, the backbone has "
                f"{len(self.layers)}"
            )
        for layer, tid in zip(self.layers, target_layer_ids):
            source = self.target.layer_state_dict(int(tid))
            own = layer.state_dict()
            missing = set(own) - set(source)
            if missing:
                raise ValueError(f"target layer {tid}: missing weights {sorted(missing)}")
            for name, tensor in own.items():
                if tuple(source[name].shape) != tuple(tensor.shape):
                    raise ValueError(
                        f"target layer {tid}: {name} has shape {tuple(source[name].shape)}, "
                        f"the backbone needs {tuple(tensor.shape)}"
                    )
                tensor.copy_(source[name])
