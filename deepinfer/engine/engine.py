"""`LLMEngine`: continuous batching over a paged KV pool, one `step()` per forward pass.

A step flows one way: the `Scheduler` plans it (``deepinfer_sched``'s batch policy: decodes
first with their look-ahead slots, prefill chunks under a token budget, preemption by recompute
when blocks run out; cached prefixes come in through the `PrefixCache` seam), a `Speculator`
(if any) proposes drafts, the `ModelRunner` runs ONE forward over the flat ragged batch, the
speculator accepts drafts from its outputs, the runner samples the rows that did not draft, and
the `OutputProcessor` applies stop rules to what each sequence emitted.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from collections.abc import Sequence as Seq

import torch

from deepinfer.engine.chunk import Chunk, StepBatch
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.model_runner import ModelRunner
from deepinfer.engine.output_processor import OutputProcessor
from deepinfer.engine.outputs import RequestMetrics, RequestOutput
from deepinfer.engine.prefix_cache import PrefixCache
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.engine.scheduler import Scheduler
from deepinfer.engine.sequence import Sequence
from deepinfer.engine.speculation import Drafts, Speculator
from deepinfer.models.kv_pool import KVPool
from deepinfer.models.llama import LlamaModel
from deepinfer.models.tokenizer import Tokenizer


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
        # A caller that shares the pool with a prefix cache's device tier passes it in.
        self.pool = pool or KVPool.for_weights(model, cfg.num_blocks, cfg.block_size)
        self.max_model_len = cfg.max_model_len or model.config.max_position_embeddings
        self.scheduler = Scheduler(
            cfg,
            self.pool,
            prefix_cache,
            lookahead=self._lookahead if speculator is not None else None,
            on_release=speculator.release if speculator is not None else None,
        )
        self.runner = ModelRunner(model, self.pool)
        self.prefix_cache = prefix_cache
        self.capacity_blocks = self.scheduler.capacity_blocks
        self.generator = torch.Generator(device="cpu").manual_seed(cfg.seed)
        self._ids = itertools.count()
        self._by_request: dict[str, Sequence] = {}
        self.outputs = OutputProcessor(tokenizer, self.max_model_len, model.config.vocab_size)
        # What the last step ran (a live step profiler reads the batch composition here).
        self.last_chunks: list[Chunk] = []

    @property
    def waiting(self) -> deque[Sequence]:
        return self.scheduler.waiting

    @property
    def running(self) -> list[Sequence]:
        return self.scheduler.running

    @property
    def num_steps(self) -> int:
        """Forward passes run so far."""
        return self.runner.num_steps

    @property
    def num_forward_tokens(self) -> int:
        """Tokens fed to the model so far (drafts and recomputed positions included)."""
        return self.runner.num_forward_tokens

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
        # As vLLM: ids the model cannot produce are refused, not silently dropped.
        for name, ids in (
            ("allowed_token_ids", params.allowed_token_ids or ()),
            ("logit_bias", params.logit_bias or {}),
        ):
            if any(t >= vocab for t in ids):
                raise ValueError(f"{name}: token ids must be below the vocabulary size {vocab}")
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
        self.outputs.track(seq)  # may refuse the request (e.g. a grammar that does not compile)
        self._by_request[request_id] = seq
        self.scheduler.add(seq)
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
        self.scheduler.start_running(seq)
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
        return self.scheduler.has_unfinished()

    # ------------------------------------------------------------------ one iteration
    def step(self) -> list[RequestOutput]:
        """Run one forward pass; return outputs of the requests that advanced or finished."""
        chunks = self.last_chunks = self.scheduler.schedule()
        if not chunks:
            return self._reject_unschedulable()
        batch = StepBatch(chunks, self.generator)
        spec = self.speculator
        if spec is not None:
            drafts = spec.propose(batch)
        else:
            drafts = Drafts([c.start for c in chunks], [[] for _ in chunks])
        out = self.runner.forward(
            [c.seq for c in chunks],
            drafts.bases,
            [
                c.seq.ids_between(base, c.end) + d
                for c, base, d in zip(chunks, drafts.bases, drafts.tokens)
            ],
            spec.layer_ids if spec is not None else (),
        )
        self.outputs.record_prompt_logprobs(chunks, drafts.bases, out)
        emitted = spec.accept(batch, drafts, out) if spec is not None else [None] * len(chunks)
        now = time.perf_counter()
        outputs: list[RequestOutput] = []
        # Only sequences whose every token now has KV produce a next token.
        plain: list[tuple[Sequence, int]] = []
        for c, base, offset, tokens in zip(chunks, drafts.bases, out.offsets, emitted):
            if tokens is not None:
                # The anchor and the accepted drafts have KV now; stale slots past them are
                # overwritten by the next step.
                c.seq.num_computed = c.start + len(tokens)
                outputs.append(self.append_tokens(c.seq, tokens, now))
                continue
            c.seq.num_computed = c.end
            if c.seq.num_computed == c.seq.num_tokens:
                plain.append((c.seq, offset + c.end - base - 1))
        if plain:
            picked = [row for _, row in plain]
            first = picked[0]
            # Decode rows are consecutive: a view, not an advanced-indexing copy (the copy was
            # ~0.15 ms of a batch-1 CPU step, cold after the forward).
            if picked == list(range(first, first + len(picked))):
                rows = out.hidden[first : first + len(picked)]
            else:
                rows = out.hidden[picked]
            sampled = self.runner.sample([seq for seq, _ in plain], rows, self.generator)
            for (seq, _), token in zip(plain, sampled):
                outputs.append(self.append_tokens(seq, [token], now))
        return outputs

    def _lookahead(self, seq: Sequence) -> int:
        assert self.speculator is not None
        return self.speculator.num_lookahead(seq, self.max_model_len)

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
        self.scheduler.finish(seq, reason, save=save)
        seq.metrics.finish_time = time.perf_counter()
        del self._by_request[seq.request_id]

    def _reject_unschedulable(self) -> list[RequestOutput]:
        """Nothing could run this step, so nothing ever will without ending a request.

        A sequence whose output outgrew the pool (running and holding it whole with nothing to
        preempt, or preempted and now too long to readmit) ends with ``"length"``, as at a
        context limit, keeping what it generated (held-back text included). Otherwise the head
        waiting request can never fit: it fails with ``error`` set."""
        grown: Sequence | None = None
        if self.running:
            grown = max(self.running, key=lambda s: len(s.block_ids))
        elif self.waiting and self.waiting[0].output_ids:
            grown = self.waiting[0]
        if grown is not None:
            held = self.outputs.release_held_text(grown)
            self._finish(grown, "length", save=True)
            return [self.outputs.output(grown, [], held)]
        if not self.waiting:
            return []
        seq = self.waiting[0]
        out = self.outputs.output(seq, [], "")
        self._finish(seq, "error", save=False)
        out.finished = True
        out.finish_reason = out.outputs[0].finish_reason = "error"
        out.error = "request does not fit in the KV pool"
        return [out]
