"""deepinfer: the thin integration layer that assembles the DeepInfer components into an engine.

Example::

    from deepinfer import LLM, SamplingParams

    with LLM() as llm:  # the embedded SmolLM2-135M-Instruct
        out = llm.generate(["The capital of France is"], SamplingParams(temperature=0))
        print(out[0].text)
"""

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

__version__ = "0.14.0"

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
