"""deepinfer: the thin integration layer that assembles the DeepInfer components into an engine.

Example::

    from deepinfer import LLM, SamplingParams

    with LLM() as llm:  # the embedded SmolLM2-135M-Instruct
        out = llm.generate(["The capital of France is"], SamplingParams(temperature=0))
        print(out[0].text)
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        return _submodule(name)
    value = getattr(import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def _submodule(name: str) -> Any:
    """``package.name`` for a submodule not imported yet (the eager package had imported them
    all), else the usual ``AttributeError``."""
    try:
        return import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__version__ = "0.15.0"

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
