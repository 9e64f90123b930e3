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

from deepinfer.engine.client import EngineClient, LocalClient
from deepinfer.engine.config import EngineConfig, SpeculativeConfig
from deepinfer.engine.engine import LLMEngine
from deepinfer.engine.logits_processor import LogitsProcessor
from deepinfer.engine.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from deepinfer.engine.prefix_cache import PrefixCache
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer_kernels.sampling import StructuredOutputsParams

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
