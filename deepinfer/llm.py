"""`LLM`: the front door. It loads a model once and serves ``generate``, ``stream`` and ``chat``.

The engine itself is assembled by :func:`~deepinfer.builder.build_engine` (the composition
root, re-exported here). `LLM` talks to an :class:`~deepinfer.engine.client.EngineClient`: a
``LocalClient`` stepping one engine in this process, or a :class:`~deepinfer.pd.PDCoordinator`
over worker processes, so both modes share every method below.
"""

from __future__ import annotations

import gc
import itertools
import os
from collections.abc import Iterator, Mapping
from collections.abc import Sequence as Seq
from dataclasses import replace
from typing import Any, cast, overload

from deepinfer.builder import BuiltEngine, build_engine, build_worker_engine, torch_dtype
from deepinfer.engine.cache_setup import PrefixCacheConfig
from deepinfer.engine.client import ClosedClient, EngineClient, LocalClient
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.fanout import fan_out, merge
from deepinfer.engine.outputs import RequestMetrics, RequestOutput
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.models.kv_pool import blocks_for_memory
from deepinfer.models.loader import LoadedModel, ModelFiles, load_model, load_model_files
from deepinfer.pd import PDConfig, PDCoordinator
from deepinfer.pd.launch import worker_source, worker_speculative
from deepinfer.speculative import SpeculativeSpec
from deepinfer_cache import TieredKVStore

# The composition root's names are re-exported: callers import them from here too.
__all__ = ["LLM", "BuiltEngine", "Prompt", "build_engine", "build_worker_engine"]

Prompt = str | Seq[int]


class LLM:
    """Load a model once and generate for many prompts with continuous batching.

    Example::

        llm = LLM()  # the embedded SmolLM2-135M-Instruct
        outs = llm.generate(["The capital of France is"], SamplingParams(temperature=0))
        print(outs[0].text)
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | LoadedModel | None = None,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        engine_config: EngineConfig | None = None,
        enable_prefix_caching: bool = True,
        prefix_cache_config: PrefixCacheConfig | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        speculative: SpeculativeSpec = None,
        pd: PDConfig | bool | None = None,
        kv_memory: int | None = None,
    ) -> None:
        """``speculative``: as in :func:`build_engine`. ``pd``: ``True`` or a
        :class:`~deepinfer.pd.PDConfig` runs prefill and decode in separate worker processes
        (see ``deepinfer.pd``); ``generate``/``stream`` then go through them.
        ``kv_memory``: bytes for the KV pool; its block count replaces
        ``engine_config.num_blocks``. The pool's memory is committed only as blocks are
        written, whatever its size."""
        weights = torch_dtype(dtype)
        pd_on = pd is not None and pd is not False
        self.loaded: LoadedModel | ModelFiles
        if isinstance(model, LoadedModel):
            self.loaded = model
        elif pd_on:  # the workers load the weights; this process only tokenizes
            self.loaded = load_model_files(model, cache_dir=cache_dir)
        else:
            self.loaded = load_model(model, dtype=weights, device=device, cache_dir=cache_dir)
        self.tokenizer = self.loaded.tokenizer
        config = engine_config or EngineConfig()
        if kv_memory is not None:
            blocks = blocks_for_memory(self.loaded.config, kv_memory, config.block_size, weights)
            config = replace(config, num_blocks=blocks)
        cache_config = (
            prefix_cache_config or PrefixCacheConfig(device_blocks=config.num_blocks // 8)
            if enable_prefix_caching
            else None
        )
        self._rejected = itertools.count()
        self.pd: PDCoordinator | None = None
        self.store: TieredKVStore | None = None
        self.client: EngineClient
        if pd_on:
            self.pd = PDCoordinator(
                worker_source(model, self.loaded),
                dtype=dtype,
                device=device,
                engine_config=config,
                config=PDConfig.coerce(cast(PDConfig | bool, pd)),
                prefix_cache=cache_config,
                speculative=worker_speculative(speculative),
                build=build_worker_engine,
                cache_dir=os.fspath(cache_dir) if cache_dir is not None else None,
            )
            self.client = self.pd
            return
        built = build_engine(
            cast(LoadedModel, self.loaded),
            engine_config=config,
            speculative=speculative,
            prefix_cache=cache_config,
        )
        self.engine = built.engine
        self.store = built.store
        self.client = LocalClient(built.engine, on_close=built.close)

    def close(self) -> None:
        """Flush the prefix cache (its disk tier survives for the next engine), stop PD
        workers, and release the model and the KV pool: their memory returns now, not when
        this object is collected. Generating afterwards raises ``RuntimeError``."""
        self.client.close()
        self.store = None
        self.client = ClosedClient()
        # The engine holds the model and the pool; the loaded model is the weights.
        for name in ("engine", "loaded"):
            self.__dict__.pop(name, None)
        gc.collect()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ helpers
    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of a text prompt, or a token-id prompt's ids (checked to be ints)."""
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        # bytes are a sequence of ints too, but nobody means them as token ids.
        if isinstance(prompt, (bytes, bytearray, memoryview)) or not isinstance(prompt, Seq):
            raise TypeError(
                f"prompt must be a str or a sequence of int token ids, got {type(prompt).__name__}"
            )
        bad = [t for t in prompt if not isinstance(t, int) or isinstance(t, bool)]
        if bad:
            raise TypeError(f"prompt token ids must be ints, got {bad[:3]!r}")
        return list(cast(Seq[int], prompt))

    def _submit(
        self, prompt: Prompt, params: SamplingParams, namespace: bytes
    ) -> tuple[list[str], dict[str, RequestOutput]]:
        """Queue one engine request per completion (``n``, ``best_of``): their ids, and the
        outputs of those refused (a bad request becomes a finished output with ``error``)."""
        rids: list[str] = []
        failed: dict[str, RequestOutput] = {}
        for child in fan_out(params):
            ids: list[int] = []
            try:
                ids = self.encode(prompt)
                rid, out = self.client.submit(ids, child, namespace)
            except (ValueError, TypeError, OverflowError) as exc:
                rid = f"rejected-{next(self._rejected)}"
                out = RequestOutput(
                    request_id=rid,
                    prompt_token_ids=ids,
                    finished=True,
                    finish_reason="error",
                    error=str(exc),
                    metrics=RequestMetrics(arrival_time=0.0),
                )
            rids.append(rid)
            if out is not None:
                failed[rid] = out
        return rids, failed

    # ------------------------------------------------------------------ API
    def generate(
        self,
        prompts: Prompt | Seq[Prompt],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        *,
        namespace: bytes | Seq[bytes] = b"",
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order.

        A prompt that is invalid (empty, ids out of range, longer than the context) yields an
        output with ``error`` set; the other prompts run normally.
        """
        batch: list[Prompt] = (
            [cast(Prompt, prompts)] if _is_single(prompts) else list(cast(Seq[Prompt], prompts))
        )
        params = _per_request(sampling_params or SamplingParams(), len(batch), "sampling_params")
        spaces = _per_request(namespace, len(batch), "namespace")
        groups: list[list[str]] = []  # one engine request per completion (n, best_of)
        done: dict[str, RequestOutput] = {}
        for prompt, p, ns in zip(batch, params, spaces):
            rids, failed = self._submit(prompt, p, ns)
            groups.append(rids)
            done.update(failed)
        order = [rid for group in groups for rid in group]
        bar = None
        if use_tqdm:
            from tqdm import tqdm  # optional progress bar, imported only when asked for

            bar = tqdm(total=len(order), initial=len(done), desc="generate", unit="req")
        for out in self.client.run_until(set(order) - set(done)):
            if out.finished and out.request_id in order:
                done[out.request_id] = out
                if bar is not None:
                    bar.update(1)
        if bar is not None:
            bar.close()
        return [merge(p, [done[rid] for rid in group]) for p, group in zip(params, groups)]

    def stream(
        self,
        prompt: Prompt,
        sampling_params: SamplingParams | None = None,
        *,
        namespace: bytes = b"",
    ) -> Iterator[RequestOutput]:
        """Yield an output each time the request advances (``new_text`` holds the increment).

        With ``n > 1`` each yield carries the completion that advanced (its ``index`` set); the
        last one, once all are done, carries every completion. Other requests already queued
        on this engine keep running alongside.
        """
        params = sampling_params or SamplingParams()
        if isinstance(params, SamplingParams) and params.num_candidates > params.n:
            raise ValueError("stream: best_of > n cannot stream (the best are known at the end)")
        rids, latest = self._submit(prompt, params, namespace)
        if len(latest) == len(rids):  # every completion was refused
            yield merge(params, [latest[r] for r in rids])
            return
        for out in self.client.run_until(set(rids) - set(latest)):
            if out.request_id not in rids:
                continue
            latest[out.request_id] = out
            if len(latest) == len(rids) and all(o.finished for o in latest.values()):
                yield merge(params, [latest[r] for r in rids])
                return
            index = rids.index(out.request_id)
            if not out.finished and all(c.index == index for c in out.outputs):
                yield out  # already what the caller sees (one completion running): no copies
                continue
            # One completion finishing does not finish the request (its outputs[0] says so).
            yield replace(
                out, finished=False, outputs=[replace(c, index=index) for c in out.outputs]
            )

    @overload
    def chat(
        self,
        messages: Seq[Mapping[str, Any]],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        *,
        namespace: bytes | Seq[bytes] = b"",
    ) -> RequestOutput: ...
    @overload
    def chat(
        self,
        messages: Seq[Seq[Mapping[str, Any]]],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        *,
        namespace: bytes | Seq[bytes] = b"",
    ) -> list[RequestOutput]: ...
    def chat(
        self,
        messages: Seq[Mapping[str, Any]] | Seq[Seq[Mapping[str, Any]]],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        *,
        namespace: bytes | Seq[bytes] = b"",
    ) -> RequestOutput | list[RequestOutput]:
        """Render ``messages`` with the model's chat template and generate the reply.

        ``messages`` is one conversation (a list of ``{"role", "content"}`` dicts: returns one
        output) or a list of conversations (batched together: returns one output each, in
        order; ``sampling_params`` and ``namespace`` may then be one per conversation).
        """
        single = not messages or isinstance(messages[0], Mapping)
        conversations = [messages] if single else list(messages)
        prompts: list[Prompt] = []
        for conv in conversations:
            text = self.loaded.chat_template.render(
                cast(Seq[Mapping[str, Any]], conv), add_generation_prompt=True
            )
            prompts.append(self.tokenizer.encode(text, add_bos=False))
        outs = self.generate(prompts, sampling_params, namespace=namespace)
        return outs[0] if single else outs


def _is_single(prompts: object) -> bool:
    if isinstance(prompts, str):
        return True
    return isinstance(prompts, Seq) and len(prompts) > 0 and isinstance(prompts[0], int)


def _per_request(value: Any, n: int, name: str) -> list[Any]:
    if isinstance(value, (SamplingParams, bytes)):
        return [value] * n
    values = list(value)
    if len(values) != n:
        raise ValueError(f"{name}: got {len(values)} values for {n} prompts")
    return values
