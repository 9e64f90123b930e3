"""`LogitsProcessor`: the seam for a caller's own logits rewrite (vLLM's per-request form).

A processor is called once per generated position with the ids generated so far (not the
prompt) and that position's logits ``[V]`` (float32, after penalties, bias and masks, before
temperature), and returns the logits to sample from. It may edit ``logits`` in place and return
it. It must be deterministic in its inputs: under speculative decoding it is called for each
position of a verify block with the draft tokens before that position appended.

Example::

    def no_digits(output_token_ids, logits):
        logits[digit_ids] = float("-inf")
        return logits

    SamplingParams(logits_processors=[no_digits])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class LogitsProcessor(Protocol):
    def __call__(self, output_token_ids: Sequence[int], logits: torch.Tensor) -> torch.Tensor: ...
