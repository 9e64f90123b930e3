"""The composition root: :func:`build_engine` assembles an engine, and nothing else does.

Loading the weights, sizing the KV pool, putting the prefix cache's tiers over it, loading and
profiling a drafter all happen here; `LLM` (``deepinfer.llm``) calls :func:`build_engine`, the
PD worker processes (through :func:`build_worker_engine`) and the HTTP server's replicas call
:func:`build_engine_from_settings`, which turns their JSON settings into its arguments.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from deepinfer.engine.cache_setup import PrefixCacheConfig, build_engine_kv
from deepinfer.engine.config import DTYPES, EngineConfig, SpeculativeConfig, torch_dtype
from deepinfer.engine.engine import LLMEngine
from deepinfer.models.loader import LoadedModel, load_model
from deepinfer.pd.worker import WorkerSettings
from deepinfer.speculative import SpeculativeSpec, build_speculator
from deepinfer_cache import TieredKVStore

__all__ = [
    "DTYPES",
    "BuiltEngine",
    "build_engine",
    "build_engine_from_settings",
    "build_worker_engine",
    "torch_dtype",
]


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


def build_engine_from_settings(
    model: str | None,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    engine: Mapping[str, Any] | None = None,
    cache: Mapping[str, Any] | None = None,
    speculative: str | Mapping[str, Any] | None = None,
    cache_dir: str | None = None,
) -> BuiltEngine:
    """:func:`build_engine` from the JSON-able settings a worker or replica process is started
    with (a process boundary carries no config objects, see `WorkerSettings`).

    ``engine``: `EngineConfig` fields; ``cache``: `PrefixCacheConfig` fields plus an optional
    ``"directory_suffix"`` (that engine's own disk directory), ``None`` for no prefix cache;
    ``speculative``: `SpeculativeConfig` fields, or a drafter name / directory as
    :func:`build_engine` takes it (empty or ``None``: off); ``cache_dir``: empty or ``None``
    for the default.
    """
    prefix_cache, suffix = None, ""
    if cache is not None:
        fields = dict(cache)
        suffix = str(fields.pop("directory_suffix", ""))
        prefix_cache = PrefixCacheConfig(**fields)
    spec: SpeculativeSpec = (
        SpeculativeConfig(**speculative) if isinstance(speculative, Mapping) else speculative
    )
    return build_engine(
        model,
        dtype=dtype,
        device=device,
        engine_config=EngineConfig(**(engine or {})),
        speculative=spec or None,
        prefix_cache=prefix_cache,
        cache_dir=cache_dir or None,
        directory_suffix=suffix,
    )


def build_worker_engine(settings: WorkerSettings) -> tuple[LLMEngine, TieredKVStore | None]:
    """A PD worker's engine from its :class:`WorkerSettings` (the coordinator hands this
    function to every worker process it spawns)."""
    built = build_engine_from_settings(
        settings.model_dir,
        dtype=settings.dtype,
        device=settings.device,
        engine=settings.engine,
        cache=settings.cache,
        speculative=settings.speculative,
        cache_dir=settings.cache_dir,
    )
    return built.engine, built.store
