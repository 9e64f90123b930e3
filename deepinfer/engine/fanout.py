"""Several completions per prompt (``n``, ``best_of``): one engine request per candidate.

The engine runs single-completion requests; a prompt with ``SamplingParams(n=3)`` becomes
three of them (``fan_out``), and their outputs are merged back into one `RequestOutput` whose
``outputs`` list holds the completions (``merge``), as vLLM returns them. With ``best_of > n``
all candidates run and the ``n`` of highest cumulative log-probability are kept. A seeded
request gives candidate ``i`` the seed ``seed + i``, so the completions differ yet the whole
set is reproducible. Only candidate 0 computes ``prompt_logprobs`` (they are the same).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from deepinfer.engine.outputs import CompletionOutput, RequestOutput
from deepinfer.engine.sampling_params import SamplingParams


def fan_out(params: SamplingParams) -> list[SamplingParams]:
    """The single-completion requests that together serve ``params``."""
    if not isinstance(params, SamplingParams) or params.num_candidates == 1:
        return [params]
    ranked = params.num_candidates > params.n
    children = []
    for i in range(params.num_candidates):
        children.append(
            replace(
                params,
                n=1,
                best_of=None,
                seed=None if params.seed is None else params.seed + i,
                # Ranking needs each candidate's cumulative log-probability.
                logprobs=params.logprobs if params.logprobs is not None or not ranked else 0,
                prompt_logprobs=params.prompt_logprobs if i == 0 else None,
            )
        )
    return children


def merge(params: SamplingParams, children: Sequence[RequestOutput]) -> RequestOutput:
    """One output for the prompt from its candidates' outputs (in candidate order)."""
    if len(children) == 1:
        return children[0]
    completions = [
        replace(c.outputs[0], index=i) if c.outputs else CompletionOutput(i, c.text, c.token_ids)
        for i, c in enumerate(children)
    ]
    errors = [c.error for c in children if c.error]
    if params.num_candidates > params.n:
        if any(c.cumulative_logprob is None for c in completions) and not errors:
            # Only a client that forwards log-probabilities can rank (PD mode does not yet).
            errors.append("best_of: the candidates' log-probabilities were not reported")
        completions.sort(key=lambda c: -(c.cumulative_logprob or 0.0))
        completions = [replace(c, index=i) for i, c in enumerate(completions[: params.n])]
    if params.logprobs is None:
        completions = [replace(c, logprobs=None) for c in completions]
    head, first = children[0], completions[0]
    return RequestOutput(
        request_id=head.request_id,
        prompt_token_ids=head.prompt_token_ids,
        token_ids=first.token_ids,
        text=first.text,
        finished=all(c.finished for c in children),
        finish_reason=first.finish_reason,
        error=errors[0] if errors else None,
        metrics=head.metrics,
        outputs=completions,
        prompt_logprobs=head.prompt_logprobs,
    )
