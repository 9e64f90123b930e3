"""deepinfer.engine: continuous batching over the paged model runner.

`LLMEngine` steps requests; the `LLM` front door and `build_engine`, which assemble one, live in
`deepinfer.llm` (the composition root, above this package).

Example::

    from deepinfer import LLMEngine, SamplingParams, build_engine

    engine: LLMEngine = build_engine().engine
    engine.add_request([1, 2, 3], SamplingParams(temperature=0, max_tokens=4))
    while engine.has_unfinished():
        print([out.new_token_ids for out in engine.step()])
"""

from typing import TYPE_CHECKING

from deepinfer.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from deepinfer.engine.client import EngineClient, LocalClient
    from deepinfer.engine.config import EngineConfig, SpeculativeConfig
    from deepinfer.engine.engine import LLMEngine
    from deepinfer.engine.logits_processor import LogitsProcessor
    from deepinfer.engine.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
    from deepinfer.engine.prefix_cache import PrefixCache
    from deepinfer.engine.sampling_params import SamplingParams
    from deepinfer_kernels.sampling import StructuredOutputsParams

# PEP 562 lazy re-exports ({name: module}): the torch-free parts (`stop_strings`) import without
# torch, for the lean CPU runtime (`deepinfer.lean`).
_EXPORTS = {
    "EngineClient": "deepinfer.engine.client",
    "LocalClient": "deepinfer.engine.client",
    "EngineConfig": "deepinfer.engine.config",
    "SpeculativeConfig": "deepinfer.engine.config",
    "LLMEngine": "deepinfer.engine.engine",
    "LogitsProcessor": "deepinfer.engine.logits_processor",
    "CompletionOutput": "deepinfer.engine.outputs",
    "Logprob": "deepinfer.engine.outputs",
    "RequestMetrics": "deepinfer.engine.outputs",
    "RequestOutput": "deepinfer.engine.outputs",
    "PrefixCache": "deepinfer.engine.prefix_cache",
    "SamplingParams": "deepinfer.engine.sampling_params",
    "StructuredOutputsParams": "deepinfer_kernels.sampling",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


__all__ = [
    "CompletionOutput",
    "EngineClient",
    "EngineConfig",
    "LLMEngine",
    "LocalClient",
    "LogitsProcessor",
    "Logprob",
    "PrefixCache",
    "RequestMetrics",
    "RequestOutput",
    "SamplingParams",
    "SpeculativeConfig",
    "StructuredOutputsParams",
]
