"""The composition root: :func:`build_engine` assembles an engine, and nothing else does.

Loading the weights, sizing the KV pool, putting the prefix cache's tiers over it, loading and
profiling a drafter all happen here; `LLM` (``deepinfer.llm``), the PD worker processes
(through :func:`build_worker_engine`) and the HTTP server's replicas all call
:func:`build_engine`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from deepinfer.engine.cache_setup import PrefixCacheConfig, build_engine_kv
from deepinfer.engine.config import EngineConfig, SpeculativeConfig
from deepinfer.engine.engine import LLMEngine
from deepinfer.models.loader import LoadedModel, load_model
from deepinfer.pd.worker import WorkerSettings
from deepinfer.speculative import SpeculativeSpec, build_speculator
from deepinfer_cache import TieredKVStore

__all__ = ["DTYPES", "BuiltEngine", "build_engine", "build_worker_engine", "torch_dtype"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype a ``dtype`` argument names; ``ValueError`` lists the choices."""
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


@dataclass
class BuiltEngine:
    """An assembled engine, the model it runs, and the prefix-cache store to close."""

    engine: LLMEngine
    loaded: LoadedModel
    store: TieredKVStore | None = None

    def close(self) -> None:
        """Flush the prefix cache (its disk tier survives for the next engine)."""
        if self.store is not None:
            self.store.close()
            self.store = None


def build_engine(
    model: str | os.PathLike[str] | LoadedModel | None = None,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    engine_config: EngineConfig | None = None,
    speculative: SpeculativeSpec = None,
    prefix_cache: PrefixCacheConfig | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    directory_suffix: str = "",
) -> BuiltEngine:
    """Assemble one engine.

    Args:
        model: a model directory or GGUF file, a :class:`LoadedModel`, or ``None`` for the
            embedded SmolLM2-135M-Instruct.
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        device: where the weights and the KV pool live (``"cpu"``, ``"cuda"``...).
        engine_config: pool size, batch limits, seed (default :class:`EngineConfig`).
        speculative: ``None`` (off), ``"dspark"`` (the shipped drafter), a drafter checkpoint
            directory, a :class:`SpeculativeConfig` (either of those plus a fixed number of
            drafts to verify, or the draft gate off), or a ``DSparkDrafter``/``DSparkSpeculator``
            (see ``deepinfer.speculative``).
        prefix_cache: the prefix cache's tiers over the engine's pool; ``None`` for none.
        cache_dir: where converted models are cached (default ``~/.cache/deepinfer``).
        directory_suffix: appended to the disk tier's directory name (engines that share a
            configuration but must not share a directory, such as PD prefill workers).

    Example::

        built = build_engine(engine_config=EngineConfig(num_blocks=256))
        built.engine.add_request([1, 2, 3], SamplingParams(temperature=0, max_tokens=4))
        while built.engine.has_unfinished():
            built.engine.step()
        built.close()
    """
    weights = torch_dtype(dtype)
    if isinstance(model, LoadedModel):
        loaded = model
    else:
        loaded = load_model(model, dtype=weights, device=device, cache_dir=cache_dir)
    config = engine_config or EngineConfig()
    pool, adapter, store = build_engine_kv(
        loaded.model, config, prefix_cache, str(loaded.path), directory_suffix=directory_suffix
    )
    try:
        speculator = build_speculator(speculative, loaded.model, pool, max_seqs=config.max_num_seqs)
        engine = LLMEngine(
            loaded.model,
            loaded.tokenizer,
            config,
            prefix_cache=adapter,
            pool=pool,
            speculator=speculator,
        )
    except BaseException:
        if store is not None:
            store.close()
        raise
    return BuiltEngine(engine, loaded, store)


def build_worker_engine(settings: WorkerSettings) -> tuple[LLMEngine, TieredKVStore | None]:
    """A PD worker's engine from its :class:`WorkerSettings` (the coordinator hands this
    function to every worker process it spawns)."""
    cache, suffix = None, ""
    if settings.cache is not None:
        fields = dict(settings.cache)
        suffix = fields.pop("directory_suffix")
        cache = PrefixCacheConfig(**fields)
    built = build_engine(
        settings.model_dir,
        dtype=settings.dtype,
        device=settings.device,
        engine_config=EngineConfig(**settings.engine),
        speculative=SpeculativeConfig(**settings.speculative) if settings.speculative else None,
        prefix_cache=cache,
        cache_dir=settings.cache_dir or None,
        directory_suffix=suffix,
    )
    return built.engine, built.store
