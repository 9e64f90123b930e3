"""The engine's side of step profiles: time an idle engine, or record a live one's steps.

``deepinfer bench --profile out.json`` writes :func:`profile_engine`'s offline profile;
``deepinfer serve --profile-out`` writes each replica's :class:`StepRecorder`.
``deepinfer-sched calibrate --profile`` fits the simulator's cost model to either, so the
simulator predicts this engine on this machine. The file format, its writer and the bounded
step log are ``deepinfer_sched.costmodel``'s (``step_log``); so is the offline profiler
(``profile_engine`` over a ``SteppableEngine``, with its ``ProfileGrid``): this module only
adapts ``LLMEngine`` to that Protocol (:class:`EngineSteps`) and turns live steps into rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from deepinfer.engine import SamplingParams
from deepinfer.engine.chunk import Chunk
from deepinfer.engine.engine import LLMEngine
from deepinfer_sched.costmodel import (
    PROFILE_FORMAT,
    EngineLimits,
    ProfileGrid,
    StepLog,
    profile_header,
    write_profile,
)
from deepinfer_sched.costmodel import profile_engine as profile_steps

# The format constant and the writer are re-exported: callers of this module use them.
__all__ = ["PROFILE_FORMAT", "EngineSteps", "StepRecorder", "profile_engine", "write_profile"]


class EngineSteps:
    """``LLMEngine`` as the profiler's ``deepinfer_sched.costmodel.SteppableEngine``."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine

    @property
    def limits(self) -> EngineLimits:
        cfg = self.engine.config
        return EngineLimits(
            max_batched_tokens=cfg.max_batched_tokens,
            max_num_seqs=cfg.max_num_seqs,
            capacity_tokens=self.engine.capacity_blocks * cfg.block_size,
            max_model_len=self.engine.max_model_len,
            block_size=cfg.block_size,
        )

    @property
    def vocab_size(self) -> int:
        return int(self.engine.model.config.vocab_size)

    def add_request(self, prompt_ids: list[int], max_tokens: int, namespace: bytes) -> None:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        self.engine.add_request(prompt_ids, params, namespace=namespace)

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    def step(self) -> None:
        self.engine.step()

    def decoding_together(self, batch_size: int) -> bool:
        running = self.engine.running
        return (
            len(running) == batch_size
            and not self.engine.waiting
            and all(s.num_computed == s.num_tokens - 1 for s in running)
        )

    def abort_all(self) -> None:
        for seq in [*self.engine.running, *self.engine.waiting]:
            self.engine.abort(seq.request_id)


def profile_engine(
    engine: LLMEngine,
    *,
    prefill_lens: Sequence[int] = (16, 64, 128, 256, 512, 1024),
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16),
    context_lens: Sequence[int] = (64, 256, 1024),
    decode_steps: int = 4,
    repeats: int = 3,
    seed: int = 0,
    model_name: str = "",
) -> dict[str, Any]:
    """Time prefill and decode steps of ``engine`` (which must be idle) and return the
    profile dict (see the module doc): ``deepinfer_sched.costmodel.profile_engine`` over the
    engine's steps. The sizes are a :class:`~deepinfer_sched.costmodel.ProfileGrid`'s; those
    the engine cannot hold at once are skipped."""
    grid = ProfileGrid(prefill_lens, batch_sizes, context_lens, decode_steps, repeats)
    return profile_steps(EngineSteps(engine), grid, seed=seed, header=_header(engine, model_name))


def _header(engine: LLMEngine, model_name: str) -> dict[str, Any]:
    cfg = engine.config
    param = next(engine.model.parameters())
    described = {
        "model": model_name,
        "device": str(param.device),
        "dtype": str(param.dtype).replace("torch.", ""),
        "block_size": cfg.block_size,
        "max_num_seqs": cfg.max_num_seqs,
        "max_batched_tokens": cfg.max_batched_tokens,
        "chunked_prefill": cfg.chunked_prefill,
    }
    return profile_header(
        described,
        kv_bytes_per_token=int(engine.pool.bytes_per_block // cfg.block_size),
        kv_capacity_tokens=int(engine.capacity_blocks * cfg.block_size),
    )


class StepRecorder(StepLog):
    """A live engine's :class:`~deepinfer_sched.costmodel.StepLog`, fed with the chunks each
    step ran. Recording a step costs a pass over its chunks, no copy of any tensor."""

    def record(self, chunks: Sequence[Chunk], seconds: float) -> None:
        """One step that ran ``chunks`` in ``seconds`` (call right after the step: a chunk
        is a prefill chunk while it is below its sequence's prefill target)."""
        prefill = [(c.length, c.start) for c in chunks if c.start < c.seq.prefill_target]
        decode = [c.end for c in chunks if c.start >= c.seq.prefill_target]
        self.add_step(prefill, len(decode), sum(decode), seconds)

    def profile(self, engine: LLMEngine, model_name: str = "") -> dict[str, Any]:
        """The live profile of the steps recorded so far on ``engine``."""
        return self.live_profile(_header(engine, model_name))
