"""The DSpark drafter: parallel backbone with context injection, Markov and confidence heads.

One forward of the backbone turns ``[anchor ; mask_1 .. mask_{G-1}]`` into hidden states
``h_1 .. h_G``; base logits are ``U_k = lm_head(h_k)`` with the target's frozen LM head. Token
``k`` is then drawn left to right from ``softmax(U_k + W1[x_{k-1}] @ W2)`` (``x_0`` = anchor),
and the confidence that it survives verification is ``c_k = sigmoid(w . [h_k ; W1[x_{k-1}]])``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Protocol, cast, runtime_checkable

import torch
from torch import nn

from deepinfer_spec.adapter import ScoringTarget, SupportsLayerWeights, SupportsLmHeadRows
from deepinfer_spec.config import DSparkConfig
from deepinfer_spec.layers import DraftLayer, RMSNorm, RopeTables, rope_tables
from deepinfer_spec.linear import LinearFn, module_linear


@runtime_checkable
class NativeDraft(Protocol):
    """A compiled greedy proposal and context projection of one drafter's weights
    (``deepinfer_kernels.cpu.dspark_draft.DSparkDraftKernel``)."""

    def greedy(
        self,
        anchor_embed: torch.Tensor,
        anchor_ids: torch.Tensor,
        context: torch.Tensor,
        valid: torch.Tensor | None,
        num_tokens: int,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def context_kv(self, features: torch.Tensor) -> torch.Tensor: ...


class DSparkDrafter(nn.Module):
    """Drafter for ``target``; holds only its own weights (the target's are borrowed, frozen).

    Args:
        config: the drafter's shape.
        target: provides ``hidden_size``, ``vocab_size``, ``num_layers``, ``embed`` and
            ``lm_head``. It is referenced, not registered as a submodule, so it is never moved,
            trained or saved with the drafter.
    """

    feature_shift: torch.Tensor
    feature_scale: torch.Tensor
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

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
        draft_size = vocab if config.draft_vocab_size is None else config.draft_vocab_size
        if draft_size > vocab:
            raise ValueError(
                f"config.draft_vocab_size: {draft_size} exceeds the target's vocabulary ({vocab})"
            )
        self.config = config
        self.hidden_size, self.vocab_size = hidden, vocab
        self.draft_vocab_size = draft_size
        # A plain attribute, bypassing nn.Module registration on purpose (see class docstring).
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_linear", module_linear)
        object.__setattr__(self, "_native", None)
        rank = config.markov_rank
        feature_dim = len(config.target_layer_ids) * hidden
        # Per-dimension standardisation of the raw target features. A Llama residual stream has
        # a few dimensions tens of times larger than the rest (and they differ between layers);
        # unstandardised, they dominate W_c's output and the context looks the same at every
        # position. Identity until fit_feature_stats is called; saved with the weights.
        self.register_buffer("feature_shift", torch.zeros(feature_dim))
        self.register_buffer("feature_scale", torch.ones(feature_dim))
        self.context_proj = nn.Linear(feature_dim, hidden, bias=False)
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
        # RoPE tables of every relative position the backbone can see (context -window..-1,
        # block 0..gamma-1): the positions never change, so they are computed once.
        rope_pos = torch.arange(-config.window, config.gamma)
        cos, sin = rope_tables(rope_pos, hidden // config.num_heads, config.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.markov_in = nn.Embedding(vocab, rank)  # W1
        nn.init.normal_(self.markov_in.weight, std=rank**-0.5)
        self.markov_out = nn.Linear(rank, draft_size, bias=False)  # W2, one row per draftable id
        if config.draft_vocab_size is not None:
            # Token id of each draft-vocabulary entry; set by restrict_vocab or a checkpoint.
            self.register_buffer("draft_vocab", torch.arange(draft_size))
        # Zero W2: an untrained drafter's sequential bias is exactly zero.
        nn.init.zeros_(self.markov_out.weight)
        self.rnn = nn.Linear(rank, rank, bias=False) if config.sequential_head == "rnn" else None
        self.confidence_head = nn.Linear(hidden + rank, 1)

    @property
    def target(self) -> ScoringTarget:
        return cast(ScoringTarget, self.__dict__["_target"])

    @property
    def linear(self) -> LinearFn:
        """How the drafter's products run (:meth:`use_linear`)."""
        return cast(LinearFn, self.__dict__["_linear"])

    def use_linear(self, fn: LinearFn | None) -> None:
        """Run every product of the drafter's own weights through ``fn`` (an engine's faster
        CPU product, say); ``None`` restores the modules themselves. See
        :mod:`deepinfer_spec.linear` for what ``fn`` must guarantee. The target's head is not
        affected (it is the target's)."""
        if fn is not None and not callable(fn):
            raise TypeError(f"fn: expected a LinearFn or None, got {type(fn).__name__}")
        object.__setattr__(self, "_linear", module_linear if fn is None else fn)

    @property
    def native(self) -> NativeDraft | None:
        """The compiled greedy proposal (:meth:`use_native`), or ``None``."""
        return cast("NativeDraft | None", self.__dict__["_native"])

    def use_native(self, kernel: NativeDraft | None) -> None:
        """Run greedy proposals without a logits hook, and the context entries, through
        ``kernel`` (``deepinfer_spec.native_draft.native_draft_kernel``: one compiled call
        each); ``None`` goes back to the modules. The kernel holds packed copies of the
        weights: call this again after changing them (training, ``load_state_dict``)."""
        if kernel is not None and not isinstance(kernel, NativeDraft):
            raise TypeError(f"kernel: expected a NativeDraft or None, got {type(kernel).__name__}")
        object.__setattr__(self, "_native", kernel)

    @property
    def feature_dim(self) -> int:
        """Size of the raw target features (``len(target_layer_ids) * hidden_size``)."""
        return self.context_proj.in_features

    def _check_features(self, features: torch.Tensor) -> None:
        if features.shape[-1] != self.feature_dim:
            raise ValueError(
                f"features: expected last dimension {self.feature_dim} "
                f"(= {len(self.config.target_layer_ids)} layers x {self.hidden_size}), "
                f"got {tuple(features.shape)}"
            )

    def project_context(self, features: torch.Tensor) -> torch.Tensor:
        """``RMSNorm(W_c @ ((features - shift) * scale))``: ``[..., feature_dim] -> [..., hidden]``.

        ``shift`` and ``scale`` are the per-dimension mean and inverse standard deviation of the
        target's features (:meth:`fit_feature_stats`), or 0 and 1 when never fitted.
        """
        self._check_features(features)
        dtype = self.context_proj.weight.dtype
        # In fp32: a shift of hundreds loses the small deviations in bf16.
        standard = (features.float() - self.feature_shift.float()) * self.feature_scale.float()
        out: torch.Tensor = self.context_norm(self.linear(standard.to(dtype), self.context_proj))
        return out

    @property
    def context_kv_dim(self) -> int:
        """Size of one position's :meth:`context_kv` entry: ``num_layers * 2 * kv_dim``."""
        layers = cast(Sequence[DraftLayer], self.layers)
        return sum(2 * layer.kv_dim for layer in layers)

    def context_kv(self, context: torch.Tensor) -> torch.Tensor:
        """Every backbone layer's keys (unrotated) and values of projected context positions:
        ``[..., H] -> [..., context_kv_dim]``, laid out ``[num_layers, 2, kv_dim]``.

        They depend on the position's own projected features only, so a decoder can compute
        them once per position, keep them in its :class:`~deepinfer_spec.state.ContextRing`
        instead of the projected features, and pass them to :meth:`backbone` as ``context``.
        """
        if context.shape[-1] != self.hidden_size:
            raise ValueError(
                f"context: expected last dimension {self.hidden_size}, got {tuple(context.shape)}"
            )
        layers = cast(Sequence[DraftLayer], self.layers)
        parts = [t for layer in layers for t in layer.context_kv(context, self.linear)]
        return torch.cat(parts, dim=-1)

    @torch.no_grad()
    def fit_feature_stats(self, features: torch.Tensor) -> None:
        """Set the standardisation of :meth:`project_context` from a sample of target features.

        ``features [..., feature_dim]``: rows from ordinary positions of real text. Leave out a
        sequence's first position: Llama-family models park a huge activation there (an
        attention sink), which would swamp the statistics.
        """
        self._check_features(features)
        rows = features.reshape(-1, self.feature_dim).float()
        if rows.shape[0] < 2:
            raise ValueError(f"features: need at least 2 rows, got {rows.shape[0]}")
        if not bool(torch.isfinite(rows).all()):
            raise ValueError("features: contains NaN or infinite values")
        mean, std = rows.mean(0), rows.std(0)
        # A dimension constant over the sample carries nothing: give it scale 1, not 1/0.
        floor = max(float(std.max()) * 1e-6, 1e-12)
        scale = torch.where(std > floor, 1.0 / std.clamp_min(floor), torch.ones_like(std))
        self.feature_shift.copy_(mean)
        self.feature_scale.copy_(scale)

    def backbone(
        self,
        anchor_ids: torch.Tensor,
        context: torch.Tensor,
        context_valid: torch.Tensor,
        *,
        context_is_kv: bool = False,
    ) -> torch.Tensor:
        """Hidden states ``h [B, G, H]`` of the block, in one pass.

        ``anchor_ids [B]``; ``context [B, W, H]`` projected features of the ``W`` positions
        before the anchor, oldest first (``W`` <= ``window``), or with ``context_is_kv`` their
        :meth:`context_kv` ``[B, W, context_kv_dim]`` (the same result up to rounding, without
        projecting the context again); ``context_valid [B, W]`` bool.
        """
        batch = int(anchor_ids.shape[0])
        if anchor_ids.ndim != 1:
            raise ValueError(f"anchor_ids: expected [B], got {tuple(anchor_ids.shape)}")
        size = self.context_kv_dim if context_is_kv else self.hidden_size
        if context.ndim != 3 or context.shape[0] != batch or context.shape[2] != size:
            what = "context_kv entries" if context_is_kv else "projected features"
            raise ValueError(
                f"context: expected [{batch}, W, {size}] ({what}), got {tuple(context.shape)}"
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
        mask: torch.Tensor | None = None
        # A full window (every step of a sequence past its first 128 tokens) needs no mask;
        # without one the attention skips reading and applying it.
        if not bool(context_valid.all()):
            keys_valid = torch.cat(
                (context_valid, torch.ones(batch, gamma, dtype=torch.bool, device=dev)), 1
            )
            mask = keys_valid[:, None, None, :]
        context = context.to(dtype)
        # Keys are positions -width .. gamma-1 (the tables' last rows); queries the last gamma.
        k_cos, k_sin = self.rope_cos[-(width + gamma) :], self.rope_sin[-(width + gamma) :]
        rope = RopeTables(k_cos[width:], k_sin[width:], k_cos, k_sin)
        offset = 0
        for layer in cast(Sequence[DraftLayer], self.layers):
            layer_context: torch.Tensor | tuple[torch.Tensor, torch.Tensor] = context
            if context_is_kv:
                kv = layer.kv_dim
                keys = context[..., offset : offset + kv]
                values = context[..., offset + kv : offset + 2 * kv]
                layer_context, offset = (keys, values), offset + 2 * kv
            x = layer(x, layer_context, mask, rope, self.linear)
        return x

    @property
    def draft_vocab_ids(self) -> torch.Tensor | None:
        """Token ids the drafter can propose, in draft-index order; ``None`` for all of them."""
        return self._buffers.get("draft_vocab")

    def draft_token_ids(self, index: torch.Tensor) -> torch.Tensor:
        """Token ids of draft-vocabulary indices (the identity without a draft vocabulary)."""
        ids = self.draft_vocab_ids
        return index if ids is None else ids[index]

    def draft_index(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`draft_token_ids`: each id's draft-vocabulary index, -1 for ids
        the drafter cannot propose (the identity without a draft vocabulary)."""
        ids = self.draft_vocab_ids
        if ids is None:
            return token_ids
        index = torch.full((self.vocab_size,), -1, dtype=torch.int64, device=ids.device)
        index[ids] = torch.arange(ids.numel(), device=ids.device)
        return index[token_ids.to(ids.device)]

    def base_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``U = lm_head(h)`` through the target's frozen head: ``[..., draft_vocab_size]``,
        only the draft vocabulary's rows of the head when there is one."""
        ids = self.draft_vocab_ids
        if ids is None:
            return self.target.lm_head(hidden)
        return self._restricted_head(ids)(hidden)

    def _restricted_head(self, ids: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        # Built once per draft vocabulary (and device): a target can pre-slice its head rows,
        # which is the whole saving. The key changes when a checkpoint is loaded into ``ids``.
        # (Inference tensors have no version counter and cannot be modified in place.)
        key = (ids.device, ids.data_ptr(), 0 if ids.is_inference() else ids._version)
        cached = self.__dict__.get("_head_cache")
        if cached is not None and cached[0] == key:
            return cast(Callable[[torch.Tensor], torch.Tensor], cached[1])
        target = self.target
        if isinstance(target, SupportsLmHeadRows):
            head = target.lm_head_rows(ids)
        else:
            rows = ids.clone()

            def head(hidden: torch.Tensor) -> torch.Tensor:
                return target.lm_head(hidden)[..., rows.to(hidden.device)]

        object.__setattr__(self, "_head_cache", (key, head))
        return head

    @torch.no_grad()
    def restrict_vocab(self, token_ids: torch.Tensor | Sequence[int]) -> DSparkDrafter:
        """A copy of this drafter that drafts only among ``token_ids`` (e.g. the most frequent
        tokens of a corpus: FR-Spec's frequency-ranked shortlist).

        On those tokens the copy computes exactly the same logits; every other token gets
        probability 0 in the draft. No retraining is needed. ``token_ids`` must be distinct ids
        the drafter can currently propose.
        """
        ids = torch.as_tensor(token_ids, dtype=torch.int64).detach().cpu()
        if ids.ndim != 1 or ids.numel() == 0:
            raise ValueError(f"token_ids: expected a non-empty 1-D list, got {tuple(ids.shape)}")
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
            raise ValueError(f"token_ids: expected ids in [0, {self.vocab_size})")
        if len(set(ids.tolist())) != ids.numel():
            raise ValueError("token_ids: duplicates are not allowed")
        rows = self.draft_index(ids)
        if bool((rows < 0).any()):
            raise ValueError("token_ids: contains ids outside the current draft vocabulary")
        config = dataclasses.replace(self.config, draft_vocab_size=int(ids.numel()))
        weight = self.markov_out.weight
        out = DSparkDrafter(config, self.target).to(device=weight.device, dtype=weight.dtype)
        state = dict(self.state_dict())
        state["markov_out.weight"] = weight[rows.to(weight.device)]
        state["draft_vocab"] = ids.to(weight.device)
        out.load_state_dict(state, strict=True)
        return out.train(self.training)

    def sequential_step(
        self, prev_ids: torch.Tensor, code: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One left-to-right step of the sequential head.

        Returns ``(bias [B, V], code [B, r])``: with ``"markov"`` ``code = W1[x_{k-1}]``; with
        ``"rnn"`` ``code = tanh(W1[x_{k-1}] + R @ code_{k-1})`` (``code_0 = 0``); ``bias = code @ W2``.
        """
        e = self.markov_in(prev_ids)
        if self.rnn is not None:
            e = torch.tanh(e if code is None else e + self.linear(code, self.rnn))
        return self.linear(e, self.markov_out), e

    def confidence_logit(self, hidden: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
        """``w . [h_k ; code_k] + b``; the confidence is its sigmoid."""
        features = torch.cat((hidden, code), dim=-1)
        return self.linear(features, self.confidence_head).squeeze(-1)

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
