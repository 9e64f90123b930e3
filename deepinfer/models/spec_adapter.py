"""`LlamaTargetAdapter`: `deepinfer_spec`'s `TargetAdapter` over `LlamaModel` and a paged KV pool.

Each speculative step is one paged forward over only the new tokens of every sequence (anchor
plus verified drafts), which returns logits and the chosen layers' hidden states for exactly
those tokens; rejecting drafts just shortens a sequence and frees whole blocks past its end.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import torch

from deepinfer.models.attention_metadata import AttentionMetadata
from deepinfer.models.kv_pool import KVPool
from deepinfer.models.llama import LlamaModel
from deepinfer_kernels.cpu import PackedWeight, linear
from deepinfer_spec.adapter import TargetOutput


@dataclass
class _Sequence:
    blocks: list[int] = field(default_factory=list)
    length: int = 0


class LlamaTargetAdapter:
    """Implements ``deepinfer_spec.TargetAdapter`` (and ``SupportsLayerWeights``,
    ``SupportsLmHeadRows``) for a :class:`LlamaModel`.

    Example::

        adapter = LlamaTargetAdapter(model, KVPool.for_model(cfg, num_blocks=256))
        out = adapter.extend(["a"], torch.tensor([[1, 2, 3]]), torch.tensor([3]), layer_ids=[1])
        adapter.truncate(["a"], torch.tensor([2]))
        adapter.release(["a"])
    """

    def __init__(self, model: LlamaModel, kv_pool: KVPool) -> None:
        if kv_pool.num_layers != model.config.num_layers:
            raise ValueError(
                f"kv_pool has {kv_pool.num_layers} layers, the model has {model.config.num_layers}"
            )
        self.model = model
        self.kv_pool = kv_pool
        self._seqs: dict[Hashable, _Sequence] = {}

    # ------------------------------------------------------------------ ScoringTarget
    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @property
    def num_layers(self) -> int:
        return self.model.config.num_layers

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed(token_ids)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """``W_out @ final_norm(hidden)`` in fp32."""
        return self.model.compute_logits(self.model.norm(hidden))

    def lm_head_rows(self, token_ids: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """``hidden -> lm_head(hidden)[..., token_ids]`` from a copy of those head rows only.

        The copy runs on the model's compiled CPU product like the full head (bf16 panels for
        few rows of a bf16-exact checkpoint); it is taken now, so it does not follow later
        changes to the model's weights.
        """
        model = self.model
        weight = model.lm_head_weight
        ids = torch.as_tensor(token_ids, dtype=torch.int64, device=weight.device)
        if ids.ndim != 1 or (
            ids.numel() and not 0 <= int(ids.min()) <= int(ids.max()) < self.vocab_size
        ):
            raise ValueError(f"token_ids: expected a 1-D tensor of ids in [0, {self.vocab_size})")
        head_module = model.embed_tokens if model.lm_head is None else model.lm_head
        if (head_rows := getattr(head_module, "head_rows", None)) is not None:
            # A head kept in a GGUF block format: the rows' own bytes (deepinfer.models.quant_layers).
            product = head_rows(ids)
            return lambda hidden: product(model.norm(hidden)).float()
        rows = weight.detach()[ids].contiguous()
        packed = PackedWeight(model.cpu_kernels.linear)

        def head(hidden: torch.Tensor) -> torch.Tensor:
            return linear(model.norm(hidden), rows, pack=packed).float()

        return head

    def score(self, input_ids: torch.Tensor, layer_ids: Sequence[int]) -> TargetOutput:
        hidden, layers = self.model.forward_dense(input_ids, layer_ids)
        return TargetOutput(
            logits=self.model.compute_logits(hidden), features=_concat(layers, hidden)
        )

    def layer_state_dict(self, layer_id: int) -> dict[str, torch.Tensor]:
        """Layer ``layer_id``'s weights under Llama names (``q_proj.weight`` ...)."""
        if not 0 <= layer_id < self.num_layers:
            raise ValueError(f"layer_id must be in [0, {self.num_layers}), got {layer_id}")
        prefix = f"model.layers.{layer_id}."
        out: dict[str, torch.Tensor] = {}
        for name, tensor in self.model.hf_state_dict().items():
            if name.startswith(prefix):
                out[name[len(prefix) :].removeprefix("self_attn.").removeprefix("mlp.")] = tensor
        return out

    # ------------------------------------------------------------------ TargetAdapter
    def length(self, seq_id: Hashable) -> int:
        seq = self._seqs.get(seq_id)
        return 0 if seq is None else seq.length

    def extend(
        self,
        seq_ids: Sequence[Hashable],
        input_ids: torch.Tensor,
        input_lens: torch.Tensor,
        layer_ids: Sequence[int],
    ) -> TargetOutput:
        """Append each row's first ``input_lens[b]`` tokens to its sequence and run the target."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, T], got {tuple(input_ids.shape)}")
        batch, width = input_ids.shape
        if len(seq_ids) != batch or tuple(input_lens.shape) != (batch,):
            raise ValueError(
                f"seq_ids and input_lens must have {batch} entries, got {len(seq_ids)} and "
                f"{tuple(input_lens.shape)}"
            )
        if len(set(seq_ids)) != batch:
            raise ValueError("seq_ids must be distinct within one call")
        lens = [int(n) for n in input_lens.tolist()]
        if any(not 1 <= n <= width for n in lens):
            raise ValueError(f"input_lens must be in [1, {width}], got {lens}")
        block_size = self.kv_pool.block_size
        seqs = [self._seqs.get(sid) or _Sequence() for sid in seq_ids]
        need = [
            max(0, -(-(s.length + n) // block_size) - len(s.blocks)) for s, n in zip(seqs, lens)
        ]
        new_blocks = self.kv_pool.allocate(sum(need))  # all or nothing
        for s, k in zip(seqs, need):
            s.blocks.extend(new_blocks[:k])
            del new_blocks[:k]
        for sid, s in zip(seq_ids, seqs):
            self._seqs[sid] = s
        seq_lens = [s.length + n for s, n in zip(seqs, lens)]
        device = self.kv_pool.tensor.device
        attn = AttentionMetadata.build(
            [s.blocks for s in seqs], seq_lens, lens, block_size, device=device
        )
        mask = torch.arange(width, device=input_ids.device)[None, :] < input_lens[:, None].to(
            input_ids.device
        )
        flat_ids = input_ids[mask].to(device)
        hidden, layers = self.model.forward_with_layers(
            flat_ids, attn.positions(), attn, self.kv_pool, layer_ids
        )
        for s, n in zip(seqs, lens):
            s.length += n
        logits = self.model.compute_logits(hidden)
        features = _concat(layers, hidden)
        return TargetOutput(logits=_pad(logits, mask), features=_pad(features, mask))

    def truncate(self, seq_ids: Sequence[Hashable], lengths: torch.Tensor) -> None:
        block_size = self.kv_pool.block_size
        for sid, n in zip(seq_ids, lengths.tolist()):
            seq = self._seqs.get(sid)
            current = 0 if seq is None else seq.length
            if not 0 <= n <= current:
                raise ValueError(f"lengths must be in [0, {current}] for sequence {sid!r}, got {n}")
            if seq is None:
                continue
            keep = -(-int(n) // block_size)
            self.kv_pool.free(seq.blocks[keep:])
            del seq.blocks[keep:]
            seq.length = int(n)

    def release(self, seq_ids: Sequence[Hashable]) -> None:
        for sid in seq_ids:
            seq = self._seqs.pop(sid, None)
            if seq is not None:
                self.kv_pool.free(seq.blocks)


def _concat(layers: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    if not layers:
        return like.new_zeros((*like.shape[:-1], 0))
    return torch.cat(layers, dim=-1)


def _pad(flat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Scatter ``[T, ...]`` rows back into a right-padded ``[B, width, ...]`` tensor of zeros."""
    out = flat.new_zeros((*mask.shape, *flat.shape[1:]))
    out[mask.to(flat.device)] = flat
    return out
