"""What PD worker processes are told to load: the model source and the drafter.

A worker is a fresh process: it cannot receive the parent's loaded model or a drafter object,
only paths it can load itself. These turn what a caller gave `LLM(pd=...)` into such paths,
and refuse (naming the argument) what a worker could not load.
"""

from __future__ import annotations

import os
from dataclasses import replace

from deepinfer.engine.config import SpeculativeConfig
from deepinfer.models.loader import LoadedModel, ModelFiles
from deepinfer.models.registry import default_model_path


def worker_source(
    model: str | os.PathLike[str] | LoadedModel | None, loaded: LoadedModel | ModelFiles
) -> str:
    """What PD workers load: the very source the parent loaded (a ``.gguf`` file stays a GGUF
    file, so in fp32 the workers run its block-format weights as the parent does), or the
    parent's model directory for a model handed over already loaded."""
    if model is None:
        return os.fspath(default_model_path())
    if isinstance(model, LoadedModel):
        return str(loaded.path)
    return os.path.abspath(os.fspath(model))


def worker_speculative(speculative: object) -> SpeculativeConfig | None:
    """PD workers load the drafter themselves: ``"dspark"``, a checkpoint directory or a
    :class:`SpeculativeConfig` naming one (a relative directory is made absolute here)."""
    if speculative is None:
        return None
    if isinstance(speculative, (str, os.PathLike)):
        speculative = SpeculativeConfig(os.fspath(speculative))
    if not isinstance(speculative, SpeculativeConfig):
        raise ValueError(
            "speculative: with pd, give 'dspark', a drafter checkpoint directory or a "
            f"SpeculativeConfig (each decode worker loads the drafter), not a "
            f"{type(speculative).__name__}"
        )
    if speculative.model == "dspark":
        return speculative
    directory = os.path.abspath(speculative.model)
    if not os.path.isfile(os.path.join(directory, "config.json")):
        raise ValueError(f"speculative: {directory!r} is not a drafter checkpoint directory")
    return replace(speculative, model=directory)
