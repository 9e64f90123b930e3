"""Speculative decoding with a DSpark drafter: propose -> schedule -> verify -> update.

One :meth:`SpecDecoder.step` for a batch of requests is one step of
:class:`~deepinfer_spec.batch_step.BatchSpeculator`, the class the engine's speculator runs too;
the decoder only adds the target's calls (``extend`` and ``truncate``):

1. the drafter proposes ``gamma`` tokens per request from its ring-buffer state, and the
   confidences are calibrated with the STS temperatures when given;
2. the verification scheduler picks how many of them to verify, ``n_b`` in ``[0, gamma]``
   (ragged across the batch);
3. the target runs once over ``[anchor ; d_1 .. d_{n_b}]`` per request (``TargetAdapter.extend``);
4. ``deepinfer_kernels.speculative_verify`` (or ``greedy_verify`` at temperature 0) accepts a
   prefix and emits one corrected or bonus token, so each step emits ``1 .. n_b + 1`` tokens;
5. the target drops the KV of rejected drafts (``truncate``), the drafter state receives the
   context features of the anchor and the accepted drafts only, and the last emitted token
   becomes the next anchor (the target has not seen it yet).

A request's prompt is handled the same way: the target reads all but its last token, whose
features seed the drafter state, and the last prompt token is the first anchor.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

import torch

from deepinfer_spec.adapter import TargetAdapter, check_target_output
from deepinfer_spec.batch_step import BatchSpeculator, StepRow
from deepinfer_spec.drafter import DSparkDrafter
from deepinfer_spec.scheduling import VerifyScheduler
from deepinfer_spec.state import ContextRing


@dataclass(frozen=True)
class StepOutput:
    """Result of one decoding step for ``request_ids`` (row ``b`` is ``request_ids[b]``).

    ``output_ids [B, G+1]`` holds ``num_emitted[b]`` tokens then -1 padding; ``confidence
    [B, G]`` is the drafter's per-position confidence for the proposed block (after STS).
    """

    request_ids: list[Hashable]
    output_ids: torch.Tensor
    num_accepted: torch.Tensor
    num_emitted: torch.Tensor
    num_draft_tokens: torch.Tensor
    draft_token_ids: torch.Tensor
    confidence: torch.Tensor

    def tokens(self, row: int) -> list[int]:
        return [int(t) for t in self.output_ids[row, : int(self.num_emitted[row])]]


@dataclass
class RequestState:
    """Where a live request stands: its ring slot, its anchor (the last emitted token, not yet
    read by the target) and the number of tokens in the target's history."""

    slot: int
    anchor: int
    length: int


class SpecDecoder:
    """Drives a target and a DSpark drafter for up to ``max_requests`` concurrent requests.

    Args:
        drafter: the drafter (its ``target`` supplies embedding and LM head).
        target: the adapter that owns the KV histories; usually the drafter's target.
        scheduler: decides per step how many drafts of each request to verify.
        max_requests: ring-buffer slots.
        temperature: ``> 0`` samples (lossless rejection sampling), ``0`` is greedy.
        generator: randomness for drafting and verification.
        sts_greedy / sts_sampling: STS temperatures ``[gamma]`` calibrating the confidence the
            scheduler sees, at temperature 0 / above (``None``: raw confidence), as the engine.
    """

    def __init__(
        self,
        drafter: DSparkDrafter,
        target: TargetAdapter,
        scheduler: VerifyScheduler,
        *,
        max_requests: int = 64,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
        sts_greedy: torch.Tensor | None = None,
        sts_sampling: torch.Tensor | None = None,
    ) -> None:
        gamma = drafter.config.gamma
        for name, temps in (("sts_greedy", sts_greedy), ("sts_sampling", sts_sampling)):
            if temps is not None and tuple(temps.shape) != (gamma,):
                raise ValueError(f"{name}: expected shape ({gamma},), got {tuple(temps.shape)}")
        self.sts_greedy, self.sts_sampling = sts_greedy, sts_sampling
        if not isinstance(temperature, (int, float)) or temperature < 0:
            raise ValueError(f"temperature: expected a float >= 0, got {temperature!r}")
        if target.vocab_size != drafter.vocab_size or target.hidden_size != drafter.hidden_size:
            raise ValueError(
                "target: vocab/hidden size differ from the drafter's "
                f"({target.vocab_size}/{target.hidden_size} vs "
                f"{drafter.vocab_size}/{drafter.hidden_size})"
            )
        self.drafter, self.target, self.scheduler = drafter, target, scheduler
        self.temperature = float(temperature)
        self.generator = generator
        self.layer_ids = list(drafter.config.target_layer_ids)
        self.device = drafter.context_proj.weight.device
        self.max_requests = max_requests
        # The drafter's context per request (its keys and values, projected lazily), drafting,
        # scheduling, verification: the same object an engine steps.
        self.spec = BatchSpeculator(
            drafter,
            scheduler,
            max_seqs=max_requests,
            sts_greedy=sts_greedy,
            sts_sampling=sts_sampling,
        )
        self._requests: dict[Hashable, RequestState] = {}

    @property
    def ring(self) -> ContextRing:
        """The drafter's context ring (keys and values; a request's newest positions may still
        be pending: ``self.spec.context.view`` projects them first)."""
        return self.spec.context.ring

    @property
    def request_ids(self) -> list[Hashable]:
        return list(self._requests)

    def request_state(self, request_id: Hashable) -> RequestState:
        """A copy of the request's state (raises ``KeyError`` for an unknown id)."""
        req = self._requests[request_id]
        return RequestState(req.slot, req.anchor, req.length)

    def add_request(self, request_id: Hashable, prompt_ids: Sequence[int]) -> None:
        self.add_requests([request_id], [prompt_ids])

    @torch.no_grad()
    def add_requests(
        self, request_ids: Sequence[Hashable], prompts: Sequence[Sequence[int]]
    ) -> None:
        """Prefill: the target reads ``prompt[:-1]``; ``prompt[-1]`` becomes the anchor."""
        if len(request_ids) != len(prompts):
            raise ValueError("prompts: expected one prompt per request id")
        if len(set(request_ids)) != len(request_ids):
            raise ValueError("request_ids: duplicates")
        vocab = self.drafter.vocab_size
        for rid, prompt in zip(request_ids, prompts):
            if rid in self._requests:
                raise ValueError(f"request_ids: {rid!r} is already active")
            if len(prompt) < 1:
                raise ValueError(f"prompts: request {rid!r} has an empty prompt")
            if any(not 0 <= int(t) < vocab for t in prompt):
                raise ValueError(f"prompts: request {rid!r} has token ids outside [0, {vocab})")
        free = self.max_requests - len(self._requests)
        if len(request_ids) > free:
            raise ValueError(
                f"request_ids: {len(request_ids)} new requests, only {free} free slots"
            )
        new = []
        context = self.spec.context
        for rid, prompt in zip(request_ids, prompts):
            length = len(prompt) - 1
            # Only the last `window` positions of a prompt can ever be attended to: the older
            # ones are never projected (a long prompt costs the drafter O(window)).
            base = context.catch_up(rid, length)
            assert base is not None  # capacity was checked above
            slot = context.slot(rid)
            assert slot is not None
            self._requests[rid] = RequestState(slot=slot, anchor=int(prompt[-1]), length=length)
            if length:
                new.append((rid, base, [int(t) for t in prompt[:-1]]))
        if not new:
            return
        width = max(len(p) for _, _, p in new)
        ids = torch.zeros(len(new), width, dtype=torch.int64, device=self.device)
        for b, (_, _, p) in enumerate(new):
            ids[b, : len(p)] = torch.tensor(p, dtype=torch.int64)
        lens = torch.tensor([len(p) for _, _, p in new], dtype=torch.int64, device=self.device)
        out = self.target.extend([rid for rid, _, _ in new], ids, lens, self.layer_ids)
        check_target_output(out, len(new), width, vocab, self.drafter.feature_dim)
        for b, (rid, base, p) in enumerate(new):
            context.push(rid, out.features[b, base : len(p)])

    def release(self, request_id: Hashable) -> None:
        self._requests.pop(request_id)
        self.spec.release(request_id)
        self.target.release([request_id])

    @torch.no_grad()
    def step(self, request_ids: Sequence[Hashable] | None = None) -> StepOutput:
        """One speculative step for ``request_ids`` (default: every active request)."""
        rids = list(self._requests) if request_ids is None else list(request_ids)
        if not rids:
            raise ValueError("request_ids: no active requests to step")
        unknown = [r for r in rids if r not in self._requests]
        if unknown:
            raise ValueError(f"request_ids: unknown requests {unknown!r}")
        reqs = [self._requests[r] for r in rids]
        dev, gamma, vocab = self.device, self.drafter.config.gamma, self.drafter.vocab_size
        batch = len(rids)
        rows = [
            StepRow(rid, r.length, r.length + 1, r.anchor, gamma, self.temperature)
            for rid, r in zip(rids, reqs)
        ]
        plan = self.spec.plan(rows)
        self.spec.draft(plan, generator=self.generator)
        block = plan.block
        assert block is not None and plan.drafting == list(range(batch))  # every row drafts
        anchors = torch.tensor([r.anchor for r in reqs], dtype=torch.int64, device=dev)
        n = block.num_draft_tokens.to(dev)
        width = block.width
        inputs = torch.cat((anchors[:, None], block.token_ids[:, : width - 1].to(dev)), dim=1)
        cols = torch.arange(width, device=dev)[None, :]
        inputs = torch.where(cols <= n[:, None], inputs, torch.zeros_like(inputs))
        out = self.target.extend(rids, inputs, n + 1, self.layer_ids)
        check_target_output(out, batch, width, vocab, self.drafter.feature_dim)
        # Verification, then only the anchor and the accepted drafts become context: rejected
        # tokens never enter it.
        results = self.spec.accept(
            plan, list(out.features), out.logits, generator=self.generator, check_values=True
        )
        output_ids = torch.full((batch, gamma + 1), -1, dtype=torch.int64, device=dev)
        num_acc = torch.zeros(batch, dtype=torch.int64, device=dev)
        for b, result in enumerate(results):
            assert result is not None
            output_ids[b, : len(result.tokens)] = torch.tensor(result.tokens, dtype=torch.int64)
            num_acc[b] = result.num_accepted
        num_emit = num_acc + 1
        new_lens = torch.tensor([r.length for r in reqs], device=dev) + num_emit
        self.target.truncate(rids, new_lens)
        for req, length, result in zip(reqs, new_lens.tolist(), results):
            assert result is not None
            req.length, req.anchor = int(length), int(result.tokens[-1])
        return StepOutput(
            request_ids=rids,
            output_ids=output_ids,
            num_accepted=num_acc,
            num_emitted=num_emit,
            num_draft_tokens=n,
            draft_token_ids=block.token_ids,
            confidence=block.confidence,
        )

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        *,
        stop_token_ids: Iterable[int] = (),
    ) -> list[list[int]]:
        """Decode every prompt (as one batch) until ``max_new_tokens`` or a stop token;
        returns the generated tokens (the stop token included). Requests are released."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: expected >= 1, got {max_new_tokens}")
        stops = set(stop_token_ids)
        ids: list[Hashable] = [("generate", i) for i in range(len(prompts))]
        self.add_requests(ids, prompts)
        outputs: dict[Hashable, list[int]] = {rid: [] for rid in ids}
        active = list(ids)
        try:
            while active:
                step = self.step(active)
                for row, rid in enumerate(step.request_ids):
                    for tok in step.tokens(row):
                        outputs[rid].append(tok)
                        if tok in stops or len(outputs[rid]) >= max_new_tokens:
                            break
                done = [r for r in active if _finished(outputs[r], max_new_tokens, stops)]
                for rid in done:
                    active.remove(rid)
                    self.release(rid)
        finally:
            for rid in active:
                self.release(rid)
        return [outputs[rid] for rid in ids]


def _finished(tokens: list[int], max_new_tokens: int, stops: set[int]) -> bool:
    return len(tokens) >= max_new_tokens or (bool(tokens) and tokens[-1] in stops)
