"""`LLMEngine`: continuous batching over a paged KV pool, one `step()` per forward pass.

Each step asks `deepinfer_sched`'s batch policy what to run (decodes first, prefill chunks under
a token budget, preemption by recompute when blocks run out), runs ONE model forward over the
flat ragged batch (attention and KV writes go through `deepinfer_kernels`), samples the next
token of every sequence whose KV is complete, and hands back what changed. A prefix cache (the
`PrefixCache` seam, `deepinfer_cache` in practice) supplies KV for cached prompt prefixes when a
sequence is admitted and keeps the full blocks of every finished sequence.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from collections.abc import Sequence as Seq

import torch

from deepinfer.engine.chunk import Chunk, Speculator
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.output_processor import OutputProcessor
from deepinfer.engine.outputs import RequestMetrics, RequestOutput
from deepinfer.engine.prefix_cache import PrefixCache
from deepinfer.engine.sampler import sample_next_tokens
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.engine.sequence import SeqStatus, Sequence
from deepinfer.models.attention_metadata import AttentionMetadata
from deepinfer.models.kv_pool import KVPool
from deepinfer.models.llama import LlamaModel
from deepinfer.models.tokenizer import Tokenizer
from deepinfer_sched.policies.batch import BatchConfig, ContinuousBatchPolicy, SeqState


class LLMEngine:
    """Serve many requests at once on one model.

    Example::

        engine = LLMEngine(model, tokenizer, EngineConfig(num_blocks=256))
        engine.add_request([1, 2, 3], SamplingParams(temperature=0, max_tokens=4))
        while engine.has_unfinished():
            for out in engine.step():
                print(out.request_id, out.new_token_ids)
    """

    def __init__(
        self,
        model: LlamaModel,
        tokenizer: Tokenizer | None,
        config: EngineConfig | None = None,
        *,
        prefix_cache: PrefixCache | None = None,
        pool: KVPool | None = None,
        speculator: Speculator | None = None,
    ) -> None:
        self.model = model
        self.speculator = speculator
        self.tokenizer = tokenizer
        self.config = config or EngineConfig()
        cfg = self.config
        self.device = model.embed_tokens.weight.device
        # A caller that shares the pool with a prefix cache's device tier passes it in.
        self.pool = pool or KVPool.for_weights(model, cfg.num_blocks, cfg.block_size)
        if self.pool.block_size != cfg.block_size:
            raise ValueError(f"pool.block_size {self.pool.block_size} != {cfg.block_size}")
        self.policy = ContinuousBatchPolicy(
            BatchConfig(
                max_num_seqs=cfg.max_num_seqs,
                max_batched_tokens=cfg.max_batched_tokens,
                chunked_prefill=cfg.chunked_prefill,
            )
        )
        self.prefix_cache = prefix_cache
        # Blocks a prefix cache's device tier reserved are not ours to hand out.
        self.capacity_blocks = self.pool.num_free_blocks
        self.max_model_len = cfg.max_model_len or model.config.max_position_embeddings
        self.generator = torch.Generator(device="cpu").manual_seed(cfg.seed)
        self._ids = itertools.count()
        self._seqs: dict[int, Sequence] = {}
        self._by_request: dict[str, Sequence] = {}
        self.outputs = OutputProcessor(tokenizer, self.max_model_len)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_steps = 0
        self.num_forward_tokens = 0

    # ------------------------------------------------------------------ requests
    def validate(self, prompt_ids: Seq[int], params: SamplingParams) -> None:
        """Raise ``ValueError`` naming what is wrong with this request (nothing else changes)."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        if len(prompt_ids) == 0:
            raise ValueError("prompt is empty: it must hold at least one token")
        vocab = self.model.config.vocab_size
        bad = [t for t in prompt_ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids must be ints in [0, {vocab}), got {bad[:5]}")
        if len(prompt_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(prompt_ids)} tokens; the context holds {self.max_model_len} "
                "and at least one must be left to generate"
            )
        blocks = -(-(len(prompt_ids) + 1) // self.config.block_size)
        if blocks > self.capacity_blocks:
            raise ValueError(
                f"prompt needs {blocks} KV blocks, the pool has {self.capacity_blocks}"
            )

    def add_request(
        self,
        prompt_ids: Seq[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
        namespace: bytes = b"",
        priority: int = 0,
        arrival_time: float | None = None,
    ) -> str:
        """Queue a request; raises ``ValueError``/``TypeError`` for bad input before queueing."""
        prompt = [int(t) if isinstance(t, int) else t for t in prompt_ids]
        self.validate(prompt, params)
        if not isinstance(namespace, bytes):
            raise TypeError(f"namespace must be bytes, got {type(namespace).__name__}")
        seq_id = next(self._ids)
        request_id = request_id if request_id is not None else str(seq_id)
        if request_id in self._by_request:
            raise ValueError(f"request_id {request_id!r} is already in flight")
        now = time.perf_counter() if arrival_time is None else arrival_time
        seq = Sequence(
            seq_id=seq_id,
            request_id=request_id,
            prompt_ids=list(prompt),
            params=params,
            namespace=namespace,
            metrics=RequestMetrics(arrival_time=now, num_prompt_tokens=len(prompt)),
            priority=priority,
        )
        if params.seed is not None:
            seq.generator = torch.Generator(device="cpu").manual_seed(params.seed)
        self._seqs[seq_id] = seq
        self._by_request[request_id] = seq
        self.outputs.track(seq)
        self.waiting.append(seq)
        return request_id

    def add_prefilled_request(
        self,
        prompt_ids: Seq[int],
        first_token: int,
        params: SamplingParams,
        write_kv: Callable[[list[int]], None],
        *,
        request_id: str | None = None,
        namespace: bytes = b"",
        arrival_time: float | None = None,
    ) -> RequestOutput:
        """Start decoding a request whose prompt was prefilled elsewhere (PD disaggregation).

        Allocates ``ceil(len(prompt) / block_size)`` blocks, lets ``write_kv(block_ids)`` fill
        them with the prompt's K/V, and registers the sequence as running with the prompt
        computed and ``first_token`` emitted. Returns that token's output (already finished if
        it met a stop rule). Raises ``OutOfBlocksError`` when the pool lacks free blocks now.
        """
        if not isinstance(first_token, int) or not 0 <= first_token < self.model.config.vocab_size:
            raise ValueError(
                f"first_token must be a token id in the vocabulary, got {first_token!r}"
            )
        request_id = self.add_request(
            prompt_ids,
            params,
            request_id=request_id,
            namespace=namespace,
            arrival_time=arrival_time,
        )
        seq = self._by_request[request_id]
        need = seq.blocks_needed(len(seq.prompt_ids), self.config.block_size)
        try:
            seq.block_ids = self.pool.allocate(need)
            write_kv(list(seq.block_ids))
        except BaseException:
            self._finish(seq, "abort", save=False)
            raise
        seq.num_computed = len(seq.prompt_ids)
        self.waiting.remove(seq)
        self.running.append(seq)
        seq.status = SeqStatus.RUNNING
        return self.append_tokens(seq, [int(first_token)], time.perf_counter())

    def kv_block_ids(self, request_id: str) -> list[int]:
        """The pool blocks holding an in-flight request's KV, in token order."""
        return list(self._by_request[request_id].block_ids)

    def abort(self, request_id: str, *, save_prefix: bool = False) -> None:
        """Drop a request and free its KV. ``save_prefix``: first store the full blocks it has
        computed in the prefix cache (a PD prefill worker hands requests off this way)."""
        seq = self._by_request.get(request_id)
        if seq is not None:
            self._finish(seq, "abort", save=save_prefix)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ one iteration
    def step(self) -> list[RequestOutput]:
        """Run one forward pass; return outputs of the requests that advanced or finished."""
        bs = self.config.block_size
        plan = self.policy.schedule(
            [self._state(s) for s in self.waiting],
            [self._state(s) for s in self.running],
            self.pool.num_free_blocks,
            bs,
        )
        for seq_id in plan.preempted:
            self._preempt(self._seqs[seq_id])
        chunks: list[Chunk] = []
        for seq_id in plan.decode_ids:
            seq = self._seqs[seq_id]
            extra = 0
            if self.speculator is not None:
                extra = self.speculator.num_draft_slots(seq, self.max_model_len)
                if extra and not self._reserve(seq, seq.num_computed + 1 + extra):
                    extra = 0
            if self._reserve(seq, seq.num_computed + 1):
                chunks.append(Chunk(seq, seq.num_computed, 1, extra))
        for seq_id, length in plan.prefill_chunks:
            seq = self._seqs[seq_id]
            if seq.status is SeqStatus.WAITING and not self._admit(seq):
                continue
            length = min(length, seq.prefill_target - seq.num_computed)
            if length > 0 and self._reserve(seq, seq.num_computed + length):
                chunks.append(Chunk(seq, seq.num_computed, length))
        finished = self._reject_unschedulable() if not chunks else []
        if not chunks:
            return finished
        if self.speculator is not None:
            return finished + self.speculator.run(self, chunks)
        return finished + self._run(chunks)

    def forward_batch(
        self,
        seqs: Seq[Sequence],
        starts: Seq[int],
        tokens: Seq[Seq[int]],
        layer_ids: Seq[int] = (),
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """ONE model forward over a flat ragged batch: sequence ``i`` feeds ``tokens[i]`` at
        positions ``starts[i]...`` (its KV up to ``starts[i]`` is already in its blocks).

        Returns the final hidden states ``[T, H]`` and the outputs of ``layer_ids``.
        """
        input_ids = [t for toks in tokens for t in toks]
        positions = [p for s, toks in zip(starts, tokens) for p in range(s, s + len(toks))]
        attn = AttentionMetadata.build(
            [seq.block_ids for seq in seqs],
            seq_lens=[s + len(toks) for s, toks in zip(starts, tokens)],
            query_lens=[len(toks) for toks in tokens],
            block_size=self.config.block_size,
            device=self.device,
        )
        ids = torch.tensor(input_ids, dtype=torch.int64, device=self.device)
        pos = torch.tensor(positions, dtype=torch.int64, device=self.device)
        with torch.inference_mode():
            hidden, layers = self.model.forward_with_layers(ids, pos, attn, self.pool, layer_ids)
        self.num_steps += 1
        self.num_forward_tokens += len(input_ids)
        return hidden, layers

    def sample_next_tokens(self, seqs: Seq[Sequence], logits: torch.Tensor) -> list[int]:
        """One token per row of ``logits`` with each request's parameters (and seed)."""
        return sample_next_tokens(seqs, logits, self.generator)

    def _run(self, chunks: list[Chunk]) -> list[RequestOutput]:
        hidden, _ = self.forward_batch(
            [c.seq for c in chunks],
            [c.start for c in chunks],
            [c.seq.all_ids[c.start : c.start + c.length] for c in chunks],
        )

        # Only sequences whose every token now has KV produce a next token.
        ready: list[Chunk] = []
        rows: list[int] = []
        offset = 0
        for c in chunks:
            offset += c.length
            c.seq.num_computed = c.start + c.length
            if c.seq.num_computed == c.seq.num_tokens:
                ready.append(c)
                rows.append(offset - 1)
        outputs: list[RequestOutput] = []
        if ready:
            with torch.inference_mode():
                logits = self.model.compute_logits(hidden[rows])
            tokens = self.sample_next_tokens([c.seq for c in ready], logits)
            now = time.perf_counter()
            for c, token in zip(ready, tokens):
                outputs.append(self.append_tokens(c.seq, [token], now))
        return outputs

    # ------------------------------------------------------------------ bookkeeping
    def append_tokens(self, seq: Sequence, tokens: list[int], now: float) -> RequestOutput:
        """Append newly emitted tokens, apply the stop rules, and build the step's output."""
        if seq.metrics.first_token_time is None:
            seq.metrics.first_token_time = now
        new, new_text, reason = self.outputs.append(seq, tokens)
        if reason is not None:
            self._finish(seq, reason, save=True)
        return self.outputs.output(seq, new, new_text)

    def _finish(self, seq: Sequence, reason: str, *, save: bool) -> None:
        if save and self.prefix_cache is not None and seq.num_computed >= self.config.block_size:
            # Keep every full block of this conversation so its next turn hits.
            self.prefix_cache.save(
                seq.all_ids[: seq.num_computed], seq.namespace, seq.block_ids, "chat"
            )
        self.pool.free(seq.block_ids)
        seq.block_ids = []
        if self.speculator is not None:
            self.speculator.release(seq.seq_id)
        if seq in self.running:
            self.running.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        seq.metrics.finish_time = time.perf_counter()
        del self._seqs[seq.seq_id]
        del self._by_request[seq.request_id]
        self.outputs.forget(seq)

    def _state(self, seq: Sequence) -> SeqState:
        # A waiting sequence's cached prefix is only looked up (and counted) when it is admitted.
        return SeqState(
            seq_id=seq.seq_id,
            prompt_len=seq.prefill_target,
            num_computed_tokens=seq.num_computed,
            num_generated=len(seq.output_ids),
            max_tokens=seq.params.max_tokens,
            priority=seq.priority,
            arrival=seq.metrics.arrival_time,
        )

    def _usable_cached(self, seq: Sequence, cached: int) -> int:
        # At least one token must be computed so the forward yields logits for the next token.
        bs = self.config.block_size
        return min(cached, (seq.prefill_target - 1) // bs * bs)

    def _admit(self, seq: Sequence) -> bool:
        """Move a waiting sequence to running, loading its cached prefix into fresh blocks."""
        bs = self.config.block_size
        cache = self.prefix_cache
        cached = 0
        if cache is not None:
            cached = self._usable_cached(seq, cache.num_cached_tokens(seq.all_ids, seq.namespace))
        if cache is not None and cached:
            blocks = self.pool.allocate(min(cached // bs, self.pool.num_free_blocks))
            loaded = cache.load(seq.all_ids[:cached], seq.namespace, blocks)
            keep = loaded // bs
            self.pool.free(blocks[keep:])
            seq.block_ids = blocks[:keep]
            seq.num_computed = keep * bs
            if seq.metrics.num_cached_tokens == 0:
                seq.metrics.num_cached_tokens = seq.num_computed
        self.waiting.remove(seq)
        self.running.append(seq)
        seq.status = SeqStatus.RUNNING
        return True

    def _reserve(self, seq: Sequence, num_tokens: int) -> bool:
        need = seq.blocks_needed(num_tokens, self.config.block_size)
        if need > self.pool.num_free_blocks:
            return False
        seq.block_ids.extend(self.pool.allocate(need))
        return True

    def _preempt(self, seq: Sequence) -> None:
        """Drop a running sequence's KV; it re-prefills prompt + generated tokens later."""
        self.pool.free(seq.block_ids)
        seq.block_ids = []
        if self.speculator is not None:
            self.speculator.release(seq.seq_id)
        seq.num_computed = 0
        seq.prefill_target = seq.num_tokens
        seq.status = SeqStatus.WAITING
        self.running.remove(seq)
        self.waiting.appendleft(seq)

    def _reject_unschedulable(self) -> list[RequestOutput]:
        """Nothing could run: with nothing running either, the head request can never fit."""
        if self.running or not self.waiting:
            return []
        seq = self.waiting[0]
        out = self.outputs.output(seq, [], "")
        self._finish(seq, "error", save=False)
        out.finished = True
        out.finish_reason = "error"
        out.error = "request does not fit in the KV pool"
        return [out]
