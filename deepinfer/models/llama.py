"""`LlamaModel`: a Llama-family decoder that runs over a flat ragged batch against a paged KV pool.

Each projection is one matmul over all ``T`` tokens of the batch (Q, K and V fused into one,
gate and up fused into one), so a step costs the same number of kernel launches whether it
holds one decode token or a mix of prefill chunks and decodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, cast

import torch
from torch import nn

import deepinfer_kernels
from deepinfer.models.attention_metadata import AttentionMetadata
from deepinfer.models.config import LlamaConfig
from deepinfer.models.fused_step import BoundStep, BoundSteps
from deepinfer.models.int_range import int_range
from deepinfer.models.kv_pool import KVPool
from deepinfer.models.layers import Embedding, Linear, RMSNorm
from deepinfer.models.llama_layers import LlamaAttention, LlamaDecoderLayer, LlamaMLP
from deepinfer.models.rope import RotaryEmbedding
from deepinfer.models.weight_names import fused_to_hf, hf_to_fused
from deepinfer_kernels.cpu import (
    CpuKernels,
    DecoderBlocks,
    DecoderPanels,
    FusedLayerKernel,
    LayerProjections,
    LayerShape,
    LayerWeightCache,
    PackedWeight,
    add_rms_norm,
    linear,
)

# The layers live in llama_layers.py; their import path here is kept (qwen, deepseek, moe).
__all__ = ["LlamaAttention", "LlamaDecoderLayer", "LlamaMLP", "LlamaModel"]


class LlamaModel(nn.Module):
    """Llama-family causal LM (RMSNorm, RoPE, GQA, SwiGLU, optionally tied embeddings).

    Example::

        model = LlamaModel(cfg)
        pool = KVPool.for_model(cfg, num_blocks=8, block_size=16)
        attn = AttentionMetadata.build([pool.allocate(1)], seq_lens=[3], query_lens=[3],
                                       block_size=16)
        hidden = model(torch.tensor([5, 6, 7]), attn.positions(), attn, pool)
        next_id = model.compute_logits(hidden[-1:]).argmax(-1)
    """

    # The attention of each layer: families differ here (qwen.py's adds per-head q/k norms).
    attention_class: ClassVar[type[LlamaAttention]] = LlamaAttention

    def __init__(self, config: LlamaConfig, *, init: bool = True) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(self.build_layer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head: Linear | None = (
            None if config.tie_word_embeddings else Linear(config.hidden_size, config.vocab_size)
        )
        # The head's packed copy lives here: with tied embeddings its weight is the embedding's.
        self._head_packed = PackedWeight()
        # The compiled layer's bound weights (the kernel package keeps and refreshes them).
        self.layer_panels = DecoderPanels(self._projections)
        # The same for projections kept in GGUF block formats (QuantLinear: the file's bytes).
        self.layer_blocks = DecoderBlocks(self._projections)
        # Those layers' calls bound over step buffers, per batch size (fused_step.py).
        self._bound_steps = BoundSteps()
        self.rope = RotaryEmbedding(
            config.head_dim, config.rope_theta, config.rope_scaling, config.max_position_embeddings
        )
        self.use_cpu_kernels(CpuKernels.all())
        if init:
            self.init_weights()

    def build_layer(self, config: LlamaConfig, layer: int) -> nn.Module:
        """Decoder layer ``layer`` (families with other layers override this)."""
        return LlamaDecoderLayer(config, layer, self.attention_class)

    def use_cpu_kernels(self, kernels: CpuKernels) -> None:
        """Run on these compiled CPU kernels where they apply (``CpuKernels()``: torch ops
        only). The model starts with ``CpuKernels.all()``; each kernel is built on first use
        and falls back to torch where it cannot be (see :mod:`deepinfer_kernels.cpu.kernels`)."""
        self.cpu_kernels = kernels
        self._head_packed.kernel = kernels.linear
        for module in self.modules():
            if isinstance(module, Linear):
                module.packed.kernel = kernels.linear

    def _apply(self, fn: Any, recurse: bool = True) -> LlamaModel:
        self._head_packed.clear()  # see Linear._apply
        self.layer_panels.clear()
        self.layer_blocks.clear()
        self._bound_steps.clear()
        return cast(LlamaModel, super()._apply(fn, recurse))  # type: ignore[no-untyped-call]

    def init_weights(self, std: float = 0.02, generator: torch.Generator | None = None) -> None:
        """Random init: matrices ~ N(0, std^2), biases 0, norm weights 1 (as HF Llama does)."""
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, (Linear, Embedding)):
                    module.weight.normal_(0.0, std, generator=generator)
                if isinstance(module, Linear) and module.bias is not None:
                    module.bias.zero_()
                if isinstance(module, RMSNorm):
                    module.weight.fill_(1.0)

    # ------------------------------------------------------------------ paged forward
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionMetadata,
        kv_pool: KVPool,
    ) -> torch.Tensor:
        """Final-norm hidden states ``[T, H]`` of a flat ragged batch; writes its K/V to the pool."""
        hidden, _ = self.forward_with_layers(input_ids, positions, attn, kv_pool, ())
        return hidden

    def forward_with_layers(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionMetadata,
        kv_pool: KVPool,
        layer_ids: Sequence[int],
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Like :meth:`forward`, also returning the output ``[T, H]`` of each decoder layer in
        ``layer_ids`` (0-based; Hugging Face's ``hidden_states[i + 1]``)."""
        self._check_inputs(input_ids, positions, attn.num_tokens)
        if kv_pool.num_layers != len(self.layers):
            raise ValueError(
                f"kv_pool has {kv_pool.num_layers} layers, the model has {len(self.layers)}"
            )
        wanted = self._check_layer_ids(layer_ids)
        cos, sin = self.rope.cos_sin(positions, self.norm.weight.dtype)
        residual = self.embed_tokens.forward(input_ids)
        captured: dict[int, torch.Tensor] = {}
        layers = self.decoder_layers()
        # Every layer sees the same metadata: validate it and plan the attention and the KV
        # writes once per forward (on CPU the per-layer checks cost more than a decode
        # attention).
        if not layers:
            return self.norm.forward(residual), []
        fused = self._fused_layers(residual, kv_pool, attn)
        if fused is not None:
            return self._forward_fused(*fused, residual, cos, sin, attn, kv_pool, wanted, layer_ids)
        plans = self._plan_layers(attn, kv_pool.block_size)
        writer = deepinfer_kernels.plan_write_kv(
            attn.slot_mapping, num_blocks=kv_pool.num_blocks, block_size=kv_pool.block_size
        )
        residual, normed = self._add_norm(residual, None, layers[0].input_layernorm)
        for i, layer in enumerate(layers):
            k_cache, v_cache = kv_pool.layer_caches(i)
            h = layer.self_attn.forward(
                normed, cos, sin, self.rope, k_cache, v_cache, plans[i], writer
            )
            residual, normed = self._add_norm(residual, h, layer.post_attention_layernorm)
            h = layer.mlp.forward(normed)
            residual, normed = self._add_norm(residual, h, self._norm_after(i))
            if i in wanted:
                captured[i] = residual
        return normed, [captured[i] for i in layer_ids]

    def _fused_layers(
        self, x: torch.Tensor, kv_pool: KVPool, attn: AttentionMetadata
    ) -> tuple[FusedLayerKernel[Any], tuple[Any, ...]] | None:
        """The compiled layer kernel this step can take (``FusedLayerKernel.applies``) and
        every layer's weights in its layout: ``cpu_kernels.quant_layer`` when every projection
        keeps a block format (GGUF, a bf16 checkpoint's own tensors), else
        ``cpu_kernels.layer`` when every projection weight is bf16-exact; None otherwise."""
        if not self.fused_layer_kernel_fits():
            return None
        k_cache = kv_pool.layer_caches(0)[0]
        if not FusedLayerKernel.operands_fit(x, k_cache, attn.slot_mapping):
            return None
        choices: tuple[tuple[FusedLayerKernel[Any] | None, LayerWeightCache[Any]], ...] = (
            (self.cpu_kernels.quant_layer, self.layer_blocks),
            (self.cpu_kernels.layer, self.layer_panels),
        )
        for kernel, cache in choices:
            if kernel is None:
                continue
            # The weights before the kernel: cached (a refusal too), so a library is not built
            # for a model that never uses it.
            weights = cache.get()
            if weights is not None and kernel.available():
                return kernel, weights
        return None

    def fused_layer_kernel_fits(self) -> bool:
        """Whether ``cpu_kernels.layer`` computes these layers: it knows Llama's attention
        over the full context, not q/k norms or sliding windows."""
        return type(self).attention_class is LlamaAttention and not self.config.layer_windows

    def _plan_layers(
        self, attn: AttentionMetadata, block_size: int
    ) -> list[deepinfer_kernels.PagedAttentionPlan]:
        """One attention plan per layer, planned once per distinct sliding window."""
        by_window: dict[int, deepinfer_kernels.PagedAttentionPlan] = {}
        plans = []
        for layer in self.decoder_layers():
            attention = layer.self_attn
            if attention.window not in by_window:
                by_window[attention.window] = attention.plan_attention(
                    attn, block_size, self.cpu_kernels.attention
                )
            plans.append(by_window[attention.window])
        return plans

    def _projections(self) -> list[LayerProjections]:
        return [
            (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
             layer.mlp.down_proj)
            for layer in self.decoder_layers()
        ]  # fmt: skip

    def _forward_fused(
        self,
        kernel: FusedLayerKernel[Any],
        panels: tuple[Any, ...],
        residual: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn: AttentionMetadata,
        kv_pool: KVPool,
        wanted: set[int],
        layer_ids: Sequence[int],
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """:meth:`forward_with_layers` on a compiled layer ``kernel`` over its weights
        ``panels`` (:meth:`_fused_layers`): per layer, one call before the attention, the
        attention, one call after it. The calls are bound once per batch size over buffers
        kept between steps (:class:`~deepinfer.models.fused_step.BoundStep`): a step copies
        its values in and, when it is a decode step, re-points the bound attention at its
        pages; other steps plan their attention (``PagedAttentionPlan.bind_cpu_layers``)."""
        rows = residual.shape[0]
        layers = self.decoder_layers()
        step = self._bound_steps.get(
            kernel, panels, rows, kv_pool.num_layers, kv_pool.layer_caches(0)
        )
        if step is None:
            caches = [kv_pool.layer_caches(i) for i in range(len(layers))]
            k_caches, v_caches = [k for k, _ in caches], [v for _, v in caches]
            step = self._bound_steps.put(self._bind_step(kernel, panels, rows, k_caches, v_caches))
        k_caches, v_caches = step.k_caches, step.v_caches
        residual, normed = self._add_norm(residual, None, layers[0].input_layernorm)
        step.load(residual, normed, cos, sin, attn.slot_mapping)
        plan = None
        # A decode or verification step re-points the step's bound attention; others plan.
        attend: Callable[[int], None] | None = step.bound_attention(attn)
        if attend is None:
            plan = self._plan_layers(attn, kv_pool.block_size)[0]
            attend = plan.bind_cpu_layers(step.q, k_caches, v_caches, step.attn_view)
        bound = step.layers
        captured: dict[int, torch.Tensor] = {}
        for i in range(len(layers)):
            bound.qkv(i)
            if attend is not None:
                attend(i)
            else:
                assert plan is not None
                out = plan.run(step.q, k_caches[i], v_caches[i])
                step.attn_out.copy_(out.reshape(rows, -1))
            bound.mlp(i)
            if i in wanted:
                captured[i] = step.residual.clone()
        # Copies: the buffers are the next step's.
        return step.normed.clone(), [captured[i] for i in layer_ids]

    def _bind_step(
        self,
        kernel: FusedLayerKernel[Any],
        panels: tuple[Any, ...],
        rows: int,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
    ) -> BoundStep:
        cfg = self.config
        shape = LayerShape(
            cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
        )
        layers = self.decoder_layers()
        norms = [(layer.post_attention_layernorm, self._norm_after(i))
                 for i, layer in enumerate(layers)]  # fmt: skip
        eps = layers[0].post_attention_layernorm.eps
        scale = layers[0].self_attn.scale
        return BoundStep(kernel, panels, shape, rows, k_caches, v_caches, norms, eps,
                         self.cpu_kernels.attention, scale)  # fmt: skip

    # ------------------------------------------------------------------ dense forward
    def forward_dense(
        self, input_ids: torch.Tensor, layer_ids: Sequence[int] = ()
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Causal forward over full sequences ``[B, S]`` with no KV cache (positions ``0..S-1``).

        Returns final-norm hidden ``[B, S, H]`` and the outputs of the layers in ``layer_ids``.
        Used for training a drafter over a frozen target and as a reference in tests.
        """
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, S], got shape {tuple(input_ids.shape)}")
        wanted = self._check_layer_ids(layer_ids)
        self._check_ids(input_ids)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        cos, sin = self.rope.cos_sin(positions, self.norm.weight.dtype)
        residual = self.embed_tokens.forward(input_ids)
        captured: dict[int, torch.Tensor] = {}
        layers = self.decoder_layers()
        first_norm = layers[0].input_layernorm if layers else self.norm
        residual, normed = self._add_norm(residual, None, first_norm)
        for i, layer in enumerate(layers):
            h = layer.self_attn.forward_dense(normed, cos, sin, self.rope)
            residual, normed = self._add_norm(residual, h, layer.post_attention_layernorm)
            h = layer.mlp.forward(normed)
            residual, normed = self._add_norm(residual, h, self._norm_after(i))
            if i in wanted:
                captured[i] = residual
        return normed, [captured[i] for i in layer_ids]

    def _add_norm(
        self, residual: torch.Tensor, delta: torch.Tensor | None, norm: RMSNorm
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(residual + delta, norm(residual + delta))``, fused on CPU when possible."""
        return add_rms_norm(residual, delta, norm.weight, norm.eps, self.cpu_kernels.norm)

    def _norm_after(self, i: int) -> RMSNorm:
        """The norm that follows decoder layer ``i``: the next layer's input norm or the final."""
        layers = self.layers
        return (
            cast(LlamaDecoderLayer, layers[i + 1]).input_layernorm
            if i + 1 < len(layers)
            else self.norm
        )

    # ------------------------------------------------------------------ heads
    def decoder_layers(self) -> list[LlamaDecoderLayer]:
        return [cast(LlamaDecoderLayer, layer) for layer in self.layers]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        self._check_ids(input_ids)
        return self.embed_tokens.forward(input_ids)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits ``[..., vocab]`` in fp32 from final-norm hidden states."""
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        if (product := getattr(head, "head_product", None)) is not None:
            # Weights kept in a GGUF block format (deepinfer.models.quant_layers): the head
            # runs on its own bytes; ``lm_head_weight`` holds those bytes, not floats.
            logits: torch.Tensor = product(hidden).float()
            return logits
        return linear(hidden, self.lm_head_weight, pack=self._head_packed).float()

    # ------------------------------------------------------------------ weights (HF names)
    def load_hf_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Load weights named as in a Hugging Face ``LlamaForCausalLM`` checkpoint.

        Q/K/V and gate/up are concatenated into the fused projections. Raises ``ValueError``
        naming any missing, unexpected or mis-shaped tensor.
        """
        fused = self.own_state_from_hf(state)
        own = self.state_dict()
        missing = sorted(set(own) - set(fused))
        unexpected = sorted(set(fused) - set(own))
        if missing or unexpected:
            raise ValueError(
                f"checkpoint does not match the config: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}"
            )
        for name, tensor in fused.items():
            if tuple(tensor.shape) != tuple(own[name].shape):
                raise ValueError(
                    f"weight {name} has shape {tuple(tensor.shape)}, expected "
                    f"{tuple(own[name].shape)}"
                )
        # A model built on the meta device (no random init) takes the tensors as they are.
        # The model takes the given tensors (their dtype and device), no copy.
        self.load_state_dict(fused, strict=True, assign=True)

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Weights under Hugging Face ``LlamaForCausalLM`` names (the inverse of loading)."""
        return fused_to_hf(self.state_dict(), self.config)

    def own_state_from_hf(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Checkpoint tensors under this module's names (Q/K/V and gate/up fused)."""
        return hf_to_fused(state, self.config)

    # ------------------------------------------------------------------ checks
    def _check_layer_ids(self, layer_ids: Iterable[int]) -> set[int]:
        wanted = set(layer_ids)
        bad = [i for i in wanted if not 0 <= i < len(self.layers)]
        if bad:
            raise ValueError(f"layer_ids must be in [0, {len(self.layers)}), got {sorted(bad)}")
        return wanted

    def _check_ids(self, input_ids: torch.Tensor) -> None:
        if input_ids.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"input_ids must be an integer tensor, got {input_ids.dtype}")
        bounds = int_range(input_ids)
        if bounds is not None and (bounds[0] < 0 or bounds[1] >= self.config.vocab_size):
            raise ValueError(f"input_ids must be in [0, {self.config.vocab_size})")

    def _check_inputs(self, input_ids: torch.Tensor, positions: torch.Tensor, tokens: int) -> None:
        if input_ids.dim() != 1 or positions.shape != input_ids.shape:
            raise ValueError(
                "input_ids and positions must both be [T], got "
                f"{tuple(input_ids.shape)} and {tuple(positions.shape)}"
            )
        if input_ids.shape[0] != tokens:
            raise ValueError(
                f"attn.slot_mapping covers {tokens} tokens, input_ids has {input_ids.shape[0]}"
            )
        self._check_ids(input_ids)
