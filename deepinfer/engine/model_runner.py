"""`ModelRunner`: one forward over a flat ragged batch, the LM head, and sampling."""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from deepinfer.engine.sampler import (
    greedy_tokens,
    prepare_logits,
    sample_next_tokens,
    sampling_tensors,
)
from deepinfer.engine.sequence import Sequence
from deepinfer.engine.speculation import ForwardOutput
from deepinfer.engine.step_inputs import (
    DecodeInputBuffers,
    VerifyInputBuffers,
    build_step_inputs,
)
from deepinfer.models.kv_pool import KVPool
from deepinfer.models.llama import LlamaModel
from deepinfer_kernels.sampling import sample_with_generators


class ModelRunner:
    """Runs ``model`` over the paged KV in ``pool``; returns hidden states and token ids."""

    def __init__(self, model: LlamaModel, pool: KVPool) -> None:
        self.model = model
        self.pool = pool
        self.device = model.embed_tokens.weight.device
        # Decode steps on the CPU write into tensors kept between steps (torch.from_numpy
        # views: no transfer for another device to wait on).
        self._decode_buffers = DecodeInputBuffers() if self.device.type == "cpu" else None
        # Likewise a step of one sequence's few tokens: a speculative verification at batch 1.
        self._verify_buffers = VerifyInputBuffers() if self.device.type == "cpu" else None
        self.num_steps = 0
        self.num_forward_tokens = 0

    def forward(
        self,
        seqs: Seq[Sequence],
        starts: Seq[int],
        tokens: Seq[Seq[int]],
        layer_ids: Seq[int] = (),
    ) -> ForwardOutput:
        """ONE model forward: sequence ``i`` feeds ``tokens[i]`` at positions ``starts[i]...``
        (its KV up to ``starts[i]`` is already in its blocks); captures ``layer_ids``."""
        tables = [seq.block_ids for seq in seqs]
        if self._decode_buffers is not None and all(len(toks) == 1 for toks in tokens):
            inputs = self._decode_buffers.fill(tables, starts, tokens, self.pool.block_size)
        elif self._verify_buffers is not None and VerifyInputBuffers.takes(tokens):
            inputs = self._verify_buffers.fill(tables, starts, tokens, self.pool.block_size)
        else:
            inputs = build_step_inputs(tables, starts, tokens, self.pool.block_size, self.device)
        with torch.inference_mode():
            hidden, layers = self.model.forward_with_layers(
                inputs.input_ids, inputs.positions, inputs.attn, self.pool, layer_ids
            )
        self.num_steps += 1
        self.num_forward_tokens += inputs.num_tokens
        offsets, offset = [], 0
        for toks in tokens:
            offsets.append(offset)
            offset += len(toks)

        def logits(rows: torch.Tensor | slice) -> torch.Tensor:
            with torch.inference_mode():
                return self.model.compute_logits(hidden[rows])

        return ForwardOutput(hidden, list(layers), offsets, logits)

    def sample(
        self, seqs: Seq[Sequence], hidden: torch.Tensor, generator: torch.Generator
    ) -> list[int]:
        """One token per row of ``hidden`` with each request's parameters (and seed).

        A batch of greedy requests takes the first maximal logit of each (processed) row
        straight away, as ``sample_next_tokens`` would: its per-row parameter tensors and
        checks were ~0.5 ms of a ~30 ms batch-1 CPU decode step (``greedy_tokens``)."""
        with torch.inference_mode():
            logits = self.model.compute_logits(hidden)
            if seqs and all(s.params.temperature == 0 for s in seqs):
                logits = prepare_logits(seqs, logits)
                picked = greedy_tokens(logits)
                if picked is not None:
                    return picked
                # NaN or +inf: the full path raises or picks as it always did.
                return sample_with_generators(
                    logits,
                    *sampling_tensors([s.params for s in seqs]),
                    [s.generator for s in seqs],
                    generator,
                )
        return sample_next_tokens(seqs, logits, generator)
