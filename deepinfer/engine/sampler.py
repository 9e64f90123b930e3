"""Turning a batch of logits into next tokens with each request's own `SamplingParams`.

`sample_next_tokens` is the one sampling entry point of the engine. Per row it records the raw
log-probabilities when the request reports them, rewrites the logits of requests that ask for
penalties, bias, bans, a structured-output mask or their own processors
(``deepinfer_kernels.sampling.process_logits`` over ``logits_processing``'s rows), then draws with ``deepinfer_kernels.sample``. Requests that use none
of these take exactly the path they took before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence as Seq

import torch

from deepinfer.engine.logits_processing import rows_for_block, rows_for_step
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.engine.sequence import Sequence
from deepinfer_kernels.sampling import process_logits, rescue_dead_rows, sample_with_generators


def raw_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """Float32 log-probabilities of logits rows, on the host: the model's raw distribution
    (before penalties, masks or temperature), vLLM's default ``raw_logprobs`` mode, so they mean
    the same whatever sampling settings a request uses."""
    return torch.log_softmax(logits.cpu().float(), dim=-1)


def sampling_tensors(
    params: Seq[SamplingParams], repeat: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row ``temperature, top_k, top_p, min_p`` tensors, each request's row repeated
    ``repeat`` times (a verify block scores ``repeat`` positions of one request)."""

    def column(values: list[float] | list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).repeat_interleave(repeat)

    return (
        column([p.temperature for p in params], torch.float32),
        column([p.top_k for p in params], torch.int64),
        column([p.top_p for p in params], torch.float32),
        column([p.min_p for p in params], torch.float32),
    )


def greedy_tokens(logits: torch.Tensor) -> list[int] | None:
    """The first maximal logit's index of each row of ``logits`` ``[B, V]``, or None when a
    row's maximum is not finite (NaN or +inf: the full sampling path decides those).

    ``argmax_v logits[b, v]`` with ties to the lower id, as ``torch.max(dim=-1)`` picks them;
    float32 rows on the CPU go through numpy (a view, no copy): at batch 1 its argmax and
    finiteness check are ~20x cheaper than torch's reduction and ``isfinite`` over 49k logits.
    """
    cpu_rows = logits.device.type == "cpu" and logits.dtype == torch.float32
    if cpu_rows and logits.dim() == 2 and not logits.requires_grad:
        rows = logits.numpy()
        tokens: list[int] = rows.argmax(axis=-1).tolist()
        # NaN is argmax's pick when present, so checking the picked values covers every row
        # (per row in Python: a few rows, where numpy's fancy indexing costs more).
        if all(math.isfinite(rows[b, t]) for b, t in enumerate(tokens)):
            return tokens
        return None
    best, picked = logits.float().max(dim=-1)
    if not bool(torch.isfinite(best).all()):
        return None
    return [int(t) for t in picked.tolist()]


def sample_next_tokens(
    seqs: Seq[Sequence], logits: torch.Tensor, shared: torch.Generator
) -> list[int]:
    """One token per row of ``logits``; seeded requests draw from their own generator, the rest
    from ``shared`` (``deepinfer_kernels.sampling.sample_with_generators``)."""
    logits = prepare_logits(seqs, logits)
    return sample_with_generators(
        logits,
        *sampling_tensors([s.params for s in seqs]),
        [s.generator for s in seqs],
        shared,
    )


def prepare_logits(seqs: Seq[Sequence], logits: torch.Tensor) -> torch.Tensor:
    """Record raw log-probabilities for requests that report them and apply each request's
    logits processing; rows of plain requests come back unchanged (and no copy is made when
    there are only such rows)."""
    keep = [i for i, s in enumerate(seqs) if s.state is not None and s.params.needs_logprobs]
    if keep:
        rows = raw_logprobs(logits[keep])
        for j, i in enumerate(keep):
            state = seqs[i].state
            assert state is not None
            state.pending_logprobs = rows[j : j + 1]
    todo = [i for i, s in enumerate(seqs) if s.params.needs_processing]
    if not todo:
        return logits
    out = logits.float().cpu().clone()
    processed = process_logits(out[todo], rows_for_step([seqs[i] for i in todo]))
    end_dead_rows([seqs[i] for i in todo], processed, mark=True)
    out[todo] = processed
    return out


def end_dead_rows(seqs: Seq[Sequence], logits: torch.Tensor, *, mark: bool) -> None:
    """A row (of ``seqs[k]``) that allows no token at all would make ``sample`` refuse the
    whole batch: ``rescue_dead_rows`` allows only that request's EOS token instead (``mark``:
    the request finishes when that token is appended, even with ``ignore_eos``; a verify block
    leaves it unmarked, as its later positions may never be emitted)."""
    eos = [s.state.eos_token_id if s.state is not None else None for s in seqs]
    for k in rescue_dead_rows(logits, eos):
        state = seqs[k].state
        if mark and state is not None:
            state.dead_end = True


def prepare_verify_logits(
    seqs: Seq[Sequence], drafts: Seq[Seq[int]], logits: torch.Tensor
) -> torch.Tensor:
    """The speculative verifier's seam: ``logits`` ``[B, W, V]`` of verify blocks (row ``b``,
    position ``j`` follows request ``b``'s first ``j`` drafts) with each request's processing
    applied per position, exactly as ``sample_next_tokens`` would at that position.

    Verification against these target logits stays lossless for any draft distribution:
    rejection sampling reproduces the (processed) target law whatever the drafter proposed, and
    a draft the mask forbids has target probability 0, so it is always rejected and the
    correction is drawn from the masked residual. Raw log-probabilities of every position are
    kept for requests that report them (``OutputProcessor.append`` takes the emitted ones).
    """
    out = logits
    for b, seq in enumerate(seqs):
        state = seq.state
        if state is not None and seq.params.needs_logprobs:
            state.pending_logprobs = raw_logprobs(logits[b])
        if not seq.params.needs_processing:
            continue
        if out is logits:
            out = logits.float().cpu().clone()
        width = out.shape[1]
        out[b] = process_logits(out[b], rows_for_block(seq, drafts[b], width))
        end_dead_rows([seq] * width, out[b], mark=False)
    return out
