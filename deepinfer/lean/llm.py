"""``LeanLLM``: generate from a GGUF model on the CPU in a process that never imports torch.

The same model (the engine's converted files, ``model_files``), the same C kernels
(``deepinfer_kernels.cpu.numpy_ops``), one request at a time: the tokenizer and stop rules are
the engine's own torch-free classes (``Tokenizer``, ``IncrementalDetokenizer``,
``StopStringMatcher``) applied in the engine's order (EOS unless ``ignore_eos``, neither before
``min_tokens``; then stop strings on the text; then ``max_tokens`` and the context length).

Example::

    from deepinfer.lean import LeanLLM, LeanSampling

    with LeanLLM(max_model_len=2048) as llm:  # the embedded SmolLM2-135M-Instruct
        out = llm.generate(["The capital of France is"], LeanSampling(temperature=0))[0]
        print(out.text)
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from deepinfer.engine.stop_strings import StopStringMatcher
from deepinfer.lean.model import LeanModel
from deepinfer.lean.model_files import lean_files
from deepinfer.lean.sampling import LeanSampling, Sampler
from deepinfer.lean.weights import load_weights
from deepinfer.models.chat_template import ChatTemplate, read_chat_template
from deepinfer.models.tokenizer import Tokenizer
from deepinfer_kernels.cpu.openmp import load_openmp_runtime, set_num_threads


def release_free_heap() -> None:
    """glibc's ``malloc_trim(0)``: return freed heap pages to the OS (a no-op elsewhere)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)


@dataclass
class LeanOutput:
    """One request's result so far: ``new_text`` is what the last step released (streaming);
    ``finish_reason`` is ``"stop"``, ``"length"`` or None while it runs; ``error`` names why a
    request failed (it then has no tokens)."""

    prompt: str
    text: str = ""
    new_text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None


class LeanLLM:
    """A GGUF model (None: the embedded default) with a context of ``max_model_len`` tokens
    (default: the model's ``max_position_embeddings``); ``threads`` sizes the kernels' OpenMP
    pool (default: ``OMP_NUM_THREADS``, else every core); ``seed`` seeds the generator of
    requests without their own seed (the engine's ``EngineConfig.seed``)."""

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        max_model_len: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        threads: int | None = None,
        seed: int = 0,
    ) -> None:
        # Before any kernel is built or loaded: they link the runtime this process has.
        load_openmp_runtime()
        if threads is not None:
            set_num_threads(threads)
        files = lean_files(model, cache_dir)
        self.tokenizer = Tokenizer.from_file(files.directory / "tokenizer.json")
        # Parsing the tokenizer's JSON leaves ~35 MB of freed heap resident (glibc returns only
        # the top of its heap on free): hand it back before the weights are touched, as the
        # engine's loader does (deepinfer.models.loader.release_free_heap).
        release_free_heap()
        weights = load_weights(files.blocks)
        self.config = weights.config
        if not self.tokenizer.eos_token_ids and self.config.eos_token_ids:
            self.tokenizer.eos_token_ids = tuple(self.config.eos_token_ids)
        length = max_model_len or self.config.max_position_embeddings
        if not isinstance(length, int) or length < 2:
            raise ValueError(f"max_model_len must be >= 2, got {max_model_len}")
        self.max_model_len = length
        self.model: LeanModel | None = LeanModel(weights, length)
        self.directory = files.directory
        self.chat_template: ChatTemplate | None = None
        self.rng = np.random.default_rng(seed)  # unseeded requests draw from it, in order

    def __enter__(self) -> LeanLLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Drop the model and its KV cache (the weights' file map closes with them)."""
        self.model = None

    def encode(self, prompt: str) -> list[int]:
        return self.tokenizer.encode(prompt)

    def generate(self, prompts: Sequence[str], params: LeanSampling) -> list[LeanOutput]:
        """One finished output per prompt, in order; a bad prompt gets ``error`` and the others
        still run."""
        outs = []
        for prompt in prompts:
            *_, last = self.stream(prompt, params)
            outs.append(last)
        return outs

    def stream(self, prompt: str, params: LeanSampling) -> Iterator[LeanOutput]:
        """The output after each generated token (the last one has ``finish_reason``); one
        output with ``error`` for a prompt that cannot run."""
        try:
            ids = self.encode(prompt)
        except ValueError as exc:
            return iter([LeanOutput(prompt, error=str(exc))])
        return self._run(prompt, ids, params)

    def chat(self, messages: Sequence[Mapping[str, Any]], params: LeanSampling) -> LeanOutput:
        """The reply to one conversation (``{"role", "content"}`` dicts), rendered with the
        model's chat template and encoded as the engine's ``LLM.chat`` does."""
        if self.chat_template is None:  # read on first use: compiling it loads jinja2
            self.chat_template = read_chat_template(self.directory, self.tokenizer)
        text = self.chat_template.render(messages, add_generation_prompt=True)
        *_, last = self._run(text, self.tokenizer.encode(text, add_bos=False), params)
        return last

    def _run(self, prompt: str, ids: list[int], params: LeanSampling) -> Iterator[LeanOutput]:
        out = LeanOutput(prompt)
        if self.model is None:
            raise RuntimeError("this LeanLLM is closed")
        try:
            self._validate(ids)
        except ValueError as exc:
            out.error = str(exc)
            yield out
            return
        model = self.model
        model.reset()
        logits = model.prefill(ids)
        sampler = Sampler(params, self.rng)
        eos = () if params.ignore_eos else tuple(self.tokenizer.eos_token_ids)
        detok = self.tokenizer.detokenizer()
        stops = StopStringMatcher(params.stop) if params.stop else None
        while True:
            banned = eos if len(out.token_ids) < params.min_tokens else ()
            token = sampler(logits, banned)
            out.token_ids.append(token)
            piece = detok.push(token)
            reason = self._stop_reason(out, token, eos, params, len(ids))
            if reason is not None:
                piece += detok.flush()
            if stops is not None:
                released, matched = stops.push(piece, check=len(out.token_ids) >= params.min_tokens)
                if matched is not None:
                    reason = "stop"
                elif reason is not None:
                    released += stops.flush()
                piece = released
            out.text += piece
            out.new_text, out.finish_reason = piece, reason
            yield out
            if reason is not None:
                return
            logits = model.decode(token)

    def _stop_reason(
        self, out: LeanOutput, token: int, eos: tuple[int, ...], params: LeanSampling,
        prompt_len: int,
    ) -> str | None:  # fmt: skip
        n = len(out.token_ids)
        if n > params.min_tokens and token in eos:
            return "stop"
        if n >= params.max_tokens or prompt_len + n >= self.max_model_len:
            return "length"
        return None

    def _validate(self, ids: list[int]) -> None:
        if not ids:
            raise ValueError("prompt is empty: it must hold at least one token")
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(ids)} tokens; the context holds {self.max_model_len} and at "
                "least one must be left to generate"
            )
