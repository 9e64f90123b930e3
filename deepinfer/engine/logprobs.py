"""Log-probabilities of chosen tokens and the top alternatives, as vLLM reports them.

They are of the model's raw distribution (``log_softmax`` of the logits before penalties,
masks or temperature), vLLM's default ``raw_logprobs`` mode, so they mean the same whatever
sampling settings a request uses.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from deepinfer.engine.outputs import Logprob, PositionLogprobs


def raw_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """``[R, V]`` float32 log-probabilities of logits rows."""
    return torch.log_softmax(logits.float(), dim=-1)


def position_logprobs(
    row: torch.Tensor, token: int, top: int, decode: Callable[[int], str | None] | None
) -> PositionLogprobs:
    """The chosen ``token``'s entry first, then the ``top`` most likely (ties by lower id);
    ranks are 1-based positions in the descending order (the chosen token's counts the tokens
    strictly more likely than it, plus one)."""
    chosen = float(row[token])
    rank = int((row > row[token]).sum()) + 1

    def entry(t: int, lp: float, r: int) -> Logprob:
        return Logprob(lp, r, decode(t) if decode is not None else None)

    out: PositionLogprobs = {token: entry(token, chosen, rank)}
    if top > 0:
        # A stable sort: tied tokens come in id order, the same on every run.
        values, ids = torch.sort(row, descending=True, stable=True)
        values, ids = values[:top], ids[:top]
        for r, (t, lp) in enumerate(zip(ids.tolist(), values.tolist()), start=1):
            if t not in out:
                out[int(t)] = entry(int(t), float(lp), r)
    return out
