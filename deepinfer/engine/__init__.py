"""deepinfer.engine: continuous batching over the paged model runner, and the `LLM` front door.

Example::

    from deepinfer.engine import LLM, SamplingParams

    llm = LLM()
    print(llm.generate("Hello", SamplingParams(temperature=0, max_tokens=8))[0].text)
"""

from deepinfer.engine.config import EngineConfig
from deepinfer.engine.engine import LLMEngine
from deepinfer.engine.llm import LLM
from deepinfer.engine.outputs import RequestMetrics, RequestOutput
from deepinfer.engine.prefix_cache import PrefixCache
from deepinfer.engine.sampling_params import SamplingParams

__all__ = [
    "LLM",
    "EngineConfig",
    "LLMEngine",
    "PrefixCache",
    "RequestMetrics",
    "RequestOutput",
    "SamplingParams",
]
