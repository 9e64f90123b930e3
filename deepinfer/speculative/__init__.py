"""deepinfer.speculative: DSpark speculative decoding inside the engine.

Off by default; ``LLM(speculative="dspark")`` uses the drafter shipped for the embedded
SmolLM2-135M-Instruct, a path uses any ``deepinfer-spec`` checkpoint. Decode steps then draft
``gamma`` tokens per sequence, verify the prefix chosen by DSpark's prefix scheduler over a
start-up SPS profile in the same single forward as the step's prefill chunks, and emit the
accepted tokens plus the bonus. Output is lossless (greedy: token-identical).

Example::

    from deepinfer import LLM
    from deepinfer.engine import SamplingParams

    llm = LLM(speculative="dspark")
    out = llm.generate(["def fib(n):"], SamplingParams(temperature=0, max_tokens=32))[0]
    print(out.text, out.metrics.num_accepted_drafts / max(1, out.metrics.num_spec_steps))
"""

from deepinfer.speculative.factory import (
    SHIPPED_DRAFTER,
    SpeculativeSpec,
    build_speculator,
    native_draft_for,
    profile_target_sps,
)
from deepinfer.speculative.speculator import DSparkSpeculator
from deepinfer_spec import SpecStats, fastest_linear, time_draft
from deepinfer_spec.training import load_sts

__all__ = [
    "SHIPPED_DRAFTER",
    "DSparkSpeculator",
    "SpecStats",
    "SpeculativeSpec",
    "build_speculator",
    "fastest_linear",
    "load_sts",
    "native_draft_for",
    "profile_target_sps",
    "time_draft",
]
