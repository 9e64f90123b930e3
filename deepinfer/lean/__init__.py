"""deepinfer.lean: the lean CPU runtime, a GGUF model on the engine's C kernels without torch.

``import torch`` alone is ~218 MB of resident memory, more than llama.cpp's whole process on
the embedded model. This runtime runs the same model (the engine's converted files, the file's
block-format weights memory-mapped once), the same compiled kernels (called on numpy arrays,
``deepinfer_kernels.cpu.numpy_ops``), one request at a time, and never imports torch.
``deepinfer generate`` uses it by default for GGUF models on the CPU (``--runtime``). See
docs/lean.md.

Example::

    from deepinfer.lean import LeanLLM, LeanSampling

    with LeanLLM(max_model_len=2048) as llm:
        print(llm.generate(["The capital of France is"], LeanSampling(temperature=0))[0].text)
"""

from deepinfer.lean.kv_cache import KVCache
from deepinfer.lean.llm import LeanLLM, LeanOutput
from deepinfer.lean.model import LeanModel
from deepinfer.lean.model_files import LeanFiles, lean_files
from deepinfer.lean.sampling import LeanSampling, Sampler
from deepinfer.lean.weights import LeanWeights, UnsupportedModel, load_weights

__all__ = [
    "KVCache",
    "LeanFiles",
    "LeanLLM",
    "LeanModel",
    "LeanOutput",
    "LeanSampling",
    "LeanWeights",
    "Sampler",
    "UnsupportedModel",
    "lean_files",
    "load_weights",
]
