"""deepinfer: the thin integration layer that assembles the DeepInfer components into an engine.

Example::

    from deepinfer import LLM, SamplingParams

    with LLM() as llm:  # the embedded SmolLM2-135M-Instruct
        out = llm.generate(["The capital of France is"], SamplingParams(temperature=0))
        print(out[0].text)
"""

from typing import TYPE_CHECKING

from deepinfer.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from deepinfer.builder import BuiltEngine, build_engine
    from deepinfer.engine import (
        CompletionOutput,
        EngineConfig,
        LLMEngine,
        Logprob,
        RequestMetrics,
        RequestOutput,
        SamplingParams,
        SpeculativeConfig,
        StructuredOutputsParams,
    )
    from deepinfer.engine.cache_setup import PrefixCacheConfig
    from deepinfer.llm import LLM

# PEP 562 lazy re-exports ({name: module}): importing deepinfer loads no torch, so the CLI and
# the lean CPU runtime (`deepinfer.lean`) run without it; the engine loads with the first of its
# names.
_EXPORTS = {
    "BuiltEngine": "deepinfer.builder",
    "build_engine": "deepinfer.builder",
    "CompletionOutput": "deepinfer.engine",
    "EngineConfig": "deepinfer.engine",
    "LLMEngine": "deepinfer.engine",
    "Logprob": "deepinfer.engine",
    "RequestMetrics": "deepinfer.engine",
    "RequestOutput": "deepinfer.engine",
    "SamplingParams": "deepinfer.engine",
    "SpeculativeConfig": "deepinfer.engine",
    "StructuredOutputsParams": "deepinfer.engine",
    "PrefixCacheConfig": "deepinfer.engine.cache_setup",
    "LLM": "deepinfer.llm",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


__version__ = "0.17.0"

__all__ = [
    "LLM",
    "BuiltEngine",
    "CompletionOutput",
    "EngineConfig",
    "LLMEngine",
    "Logprob",
    "PrefixCacheConfig",
    "RequestMetrics",
    "RequestOutput",
    "SamplingParams",
    "SpeculativeConfig",
    "StructuredOutputsParams",
    "__version__",
    "build_engine",
]
