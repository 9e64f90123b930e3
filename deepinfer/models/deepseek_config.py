"""`DeepseekConfig`: the shape of a DeepSeek-V2/V3 model (MLA attention, fine-grained MoE).

It extends :class:`~deepinfer.models.config.LlamaConfig` so that everything sized from a config
(the embedding, final norm, head, rotary table, KV pool) reads the same fields: ``head_dim`` is
the rotary width ``qk_rope_head_dim`` and ``intermediate_size`` the dense layers' MLP width.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from deepinfer.models.config import LlamaConfig
from deepinfer.models.hf_config import hf_eos_ids, hf_rope_scaling, hf_rope_theta
from deepinfer.models.rope_scaling import rope_scaling_from_dict as _rope_scaling_from_dict
from deepinfer.models.rope_scaling import yarn_mscale

DEEPSEEK_ARCHITECTURES = {
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
}


@dataclass(frozen=True)
class DeepseekConfig(LlamaConfig):
    """Hyper-parameters of a DeepSeek-V2/V3 decoder.

    Attention is multi-head latent attention: per token the cache keeps one latent
    ``[c_kv (kv_lora_rank) | k_rope (qk_rope_head_dim)]``; keys and values of every head are
    up-projections of ``c_kv`` (``kv_b_proj``). Layers from ``first_k_dense_replace`` on are
    mixture-of-experts layers: ``n_routed_experts`` experts of width ``moe_intermediate_size``
    (``num_experts_per_tok`` chosen per token, grouped top-k with ``n_group``/``topk_group``)
    plus ``n_shared_experts`` always-on experts.
    """

    kv_lora_rank: int = 512
    q_lora_rank: int | None = 1536
    qk_nope_head_dim: int = 128
    v_head_dim: int = 128
    n_routed_experts: int = 0
    n_shared_experts: int = 0
    num_experts_per_tok: int = 1
    moe_intermediate_size: int = 0
    first_k_dense_replace: int = 0
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = False
    scoring_func: str = "softmax"  # V3: sigmoid (with the correction bias), V2: softmax
    rope_interleave: bool = True  # rotary pairs are (x0, x1), (x2, x3)... in the weights
    MODEL_TYPES: ClassVar[tuple[str, ...]] = tuple(DEEPSEEK_ARCHITECTURES)

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("kv_lora_rank", "qk_nope_head_dim", "v_head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.q_lora_rank is not None and self.q_lora_rank <= 0:
            raise ValueError(f"q_lora_rank must be positive or None, got {self.q_lora_rank}")
        if self.scoring_func not in ("softmax", "sigmoid"):
            raise ValueError(
                f"scoring_func {self.scoring_func!r} is not supported (softmax or sigmoid)"
            )
        if self.n_routed_experts:
            if self.moe_intermediate_size <= 0:
                raise ValueError("moe_intermediate_size must be positive with routed experts")
            if self.n_routed_experts % self.n_group:
                raise ValueError(
                    f"n_group ({self.n_group}) must divide n_routed_experts "
                    f"({self.n_routed_experts})"
                )
            if not 1 <= self.topk_group <= self.n_group:
                raise ValueError(f"topk_group must be in [1, n_group], got {self.topk_group}")
            eligible = self.topk_group * (self.n_routed_experts // self.n_group)
            if not 1 <= self.num_experts_per_tok <= eligible:
                raise ValueError(
                    f"num_experts_per_tok must be in [1, {eligible}] (the experts of topk_group "
                    f"groups), got {self.num_experts_per_tok}"
                )
        if not 0 <= self.first_k_dense_replace <= self.num_layers:
            raise ValueError(
                f"first_k_dense_replace must be in [0, num_layers], got {self.first_k_dense_replace}"
            )

    @property
    def qk_rope_head_dim(self) -> int:
        return self.head_dim

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.head_dim

    @property
    def latent_dim(self) -> int:
        """Width of one cached token per layer: ``kv_lora_rank + qk_rope_head_dim``."""
        return self.kv_lora_rank + self.head_dim

    @property
    def softmax_scale(self) -> float:
        """``qk_head_dim ** -0.5``, times ``mscale(factor, mscale_all_dim)^2`` under YaRN (the
        attention temperature DeepSeek folds into the scale rather than into cos/sin)."""
        scale = 1.0 / math.sqrt(self.qk_head_dim)
        rs = self.rope_scaling
        if rs is not None and rs.rope_type == "yarn" and rs.mscale_all_dim:
            mscale = yarn_mscale(rs.factor, rs.mscale_all_dim)
            scale *= mscale * mscale
        return scale

    def is_moe_layer(self, layer: int) -> bool:
        return self.n_routed_experts > 0 and layer >= self.first_k_dense_replace

    def kv_page_layout(self) -> tuple[int, int, int]:
        """One latent plane of one head: ``[c_kv | k_rope]`` per token and layer."""
        return 1, 1, self.latent_dim

    def to_hf_config(self) -> dict[str, Any]:
        """The ``config.json`` dict transformers' DeepSeek class would load (the inverse of
        :meth:`from_hf_config`)."""
        out = {
            k: v
            for k, v in super().to_hf_config().items()
            if k not in ("head_dim", "mlp_bias", "sliding_window", "layer_types")
        }
        out.update(
            architectures=[DEEPSEEK_ARCHITECTURES[self.model_type]],
            model_type=self.model_type,
            num_key_value_heads=self.num_heads,
            qk_rope_head_dim=self.head_dim,
            kv_lora_rank=self.kv_lora_rank,
            q_lora_rank=self.q_lora_rank,
            qk_nope_head_dim=self.qk_nope_head_dim,
            v_head_dim=self.v_head_dim,
            n_routed_experts=self.n_routed_experts,
            n_shared_experts=self.n_shared_experts,
            num_experts_per_tok=self.num_experts_per_tok,
            moe_intermediate_size=self.moe_intermediate_size,
            first_k_dense_replace=self.first_k_dense_replace,
            n_group=self.n_group,
            topk_group=self.topk_group,
            routed_scaling_factor=self.routed_scaling_factor,
            norm_topk_prob=self.norm_topk_prob,
            scoring_func=self.scoring_func,
            rope_interleave=self.rope_interleave,
        )
        if self.model_type == "deepseek_v2":
            out["topk_method"] = "group_limited_greedy" if self.n_group > 1 else "greedy"
        return out

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any]) -> DeepseekConfig:
        """Build from a ``DeepseekV2ForCausalLM`` / ``DeepseekV3ForCausalLM`` ``config.json``;
        settings the model does not implement raise ``ValueError`` naming them."""
        model_type = str(cfg.get("model_type"))
        if model_type not in DEEPSEEK_ARCHITECTURES:
            raise ValueError(f"model_type {model_type!r} is not a DeepSeek-V2/V3 model")
        _check_deepseek(cfg, model_type)
        try:
            heads = int(cfg["num_attention_heads"])
            q_lora = cfg.get("q_lora_rank")
            routed = int(cfg.get("n_routed_experts") or cfg.get("num_experts") or 0)
            greedy = model_type == "deepseek_v2" and cfg.get("topk_method") in (None, "greedy")
            scoring = cfg.get(
                "scoring_func", "sigmoid" if model_type == "deepseek_v3" else "softmax"
            )
            return cls(
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=int(cfg["hidden_size"]),
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=heads,  # MLA: every head reads the one latent
                head_dim=int(cfg["qk_rope_head_dim"]),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=hf_rope_theta(cfg),
                rope_scaling=_rope_scaling_from_dict(hf_rope_scaling(cfg)),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=hf_eos_ids(cfg),
                attention_bias=bool(cfg.get("attention_bias", False)),
                model_type=model_type,
                kv_lora_rank=int(cfg["kv_lora_rank"]),
                q_lora_rank=None if q_lora is None else int(q_lora),
                qk_nope_head_dim=int(cfg["qk_nope_head_dim"]),
                v_head_dim=int(cfg["v_head_dim"]),
                n_routed_experts=routed,
                n_shared_experts=int(cfg.get("n_shared_experts") or 0),
                num_experts_per_tok=int(cfg.get("num_experts_per_tok") or 1),
                moe_intermediate_size=int(cfg.get("moe_intermediate_size") or 0),
                first_k_dense_replace=int(cfg.get("first_k_dense_replace") or 0),
                # V2's "greedy" top-k ignores the groups its config may still list.
                n_group=1 if greedy else int(cfg.get("n_group") or 1),
                topk_group=1 if greedy else int(cfg.get("topk_group") or 1),
                routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)),
                norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
                scoring_func=str(scoring),
                rope_interleave=bool(cfg.get("rope_interleave", True)),
            )
        except KeyError as exc:
            raise ValueError(f"config.json is missing required key {exc.args[0]!r}") from exc


def _check_deepseek(cfg: Mapping[str, Any], model_type: str) -> None:
    archs = [a for a in cfg.get("architectures") or [] if a != DEEPSEEK_ARCHITECTURES[model_type]]
    if archs:
        raise ValueError(f"architecture {archs[0]!r} is not supported for {model_type}")
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"hidden_act {act!r} is not supported (only silu)")
    freq = cfg.get("moe_layer_freq", 1)
    if freq != 1:
        raise ValueError(f"moe_layer_freq = {freq} is not supported (only 1)")
    method = cfg.get("topk_method")
    allowed = {
        "deepseek_v3": ("noaux_tc", None),
        "deepseek_v2": ("greedy", "group_limited_greedy", None),
    }
    if method not in allowed[model_type]:
        raise ValueError(f"topk_method {method!r} is not supported for {model_type}")
    if cfg.get("quantization_config") is not None:
        quant = cfg["quantization_config"].get("quant_method", "?")
        raise ValueError(f"quantization_config ({quant}) is not supported")
    scaling = hf_rope_scaling(cfg) or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind not in (None, "default", "yarn"):
        raise ValueError(f"rope_scaling rope_type {kind!r} is not supported (default or yarn)")
    factor = scaling.get("factor")
    if kind == "yarn" and (factor is None or not math.isfinite(float(factor))):
        raise ValueError("rope_scaling (yarn) needs a finite factor")
