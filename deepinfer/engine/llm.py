"""`LLM`: the vLLM-style front door (load a model, `generate`, `stream`, `chat`)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Any, cast

import torch

from deepinfer.engine.cache_setup import PrefixCacheConfig, build_engine_kv
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.engine import LLMEngine
from deepinfer.engine.outputs import RequestMetrics, RequestOutput
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.models.loader import LoadedModel, load_model
from deepinfer_cache import TieredKVStore

if TYPE_CHECKING:
    from deepinfer.pd import PDCoordinator

Prompt = str | Seq[int]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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
        speculative: Any = None,
        pd: Any = None,
    ) -> None:
        """``speculative``: ``None`` (off), ``"dspark"`` (the shipped drafter), a drafter
        checkpoint directory, or a ``DSparkDrafter``/``DSparkSpeculator`` (see ``deepinfer.speculative``).
        ``pd``: ``True`` or a ``deepinfer.pd.PDConfig`` runs prefill and decode in separate
        worker processes (see ``deepinfer.pd``); ``generate``/``stream`` then go through them."""
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        if isinstance(model, LoadedModel):
            self.loaded = model
        else:
            self.loaded = load_model(
                model, dtype=_DTYPES[dtype], device=device, cache_dir=cache_dir
            )
        self.tokenizer = self.loaded.tokenizer
        config = engine_config or EngineConfig()
        self.pd: PDCoordinator | None = None
        self.store: TieredKVStore | None = None
        cache_config = (
            prefix_cache_config or PrefixCacheConfig(device_blocks=config.num_blocks // 8)
            if enable_prefix_caching
            else None
        )
        if pd is not None and pd is not False:
            from deepinfer.pd import PDConfig, PDCoordinator  # lazy: deepinfer.pd imports engine

            if speculative is not None and not isinstance(speculative, (str, os.PathLike)):
                raise ValueError(
                    "speculative: with pd, give 'dspark' or a drafter checkpoint directory (each "
                    f"decode worker loads it), not a {type(speculative).__name__}"
                )
            if speculative is not None and speculative != "dspark":
                speculative = os.path.abspath(os.fspath(speculative))
                if not os.path.isfile(os.path.join(speculative, "config.json")):
                    raise ValueError(
                        f"speculative: {speculative!r} is not a drafter checkpoint directory"
                    )
            self.pd = PDCoordinator(
                str(self.loaded.path),
                dtype=dtype,
                device=device,
                engine_config=config,
                config=PDConfig.coerce(pd),
                prefix_cache=cache_config,
                speculative=speculative,
            )
            return
        net = self.loaded.model
        pool, adapter, self.store = build_engine_kv(
            net, config, cache_config, str(self.loaded.path)
        )
        speculator = None
        if speculative is not None:
            from deepinfer.speculative import build_speculator  # lazy: it imports the engine

            speculator = build_speculator(speculative, net, pool, max_seqs=config.max_num_seqs)
        self.engine = LLMEngine(
            net, self.tokenizer, config, prefix_cache=adapter, pool=pool, speculator=speculator
        )

    def close(self) -> None:
        """Flush the prefix cache (its disk tier survives for the next engine); stop PD workers."""
        if self.pd is not None:
            self.pd.close()
        if self.store is not None:
            self.store.close()
            self.store = None

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ helpers
    def encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        return list(prompt)

    def _encode_or_error(self, prompt: Prompt) -> list[int] | Exception:
        try:
            return self.encode(prompt)
        except (ValueError, TypeError) as exc:
            return exc

    def _add(
        self, prompt: Prompt, params: SamplingParams, namespace: bytes, request_id: str | None
    ) -> tuple[str, RequestOutput | None]:
        """Queue one request; a bad one becomes a finished output with ``error`` set."""
        try:
            ids = self.encode(prompt)
            return self.engine.add_request(
                ids, params, namespace=namespace, request_id=request_id
            ), None
        except (ValueError, TypeError) as exc:
            rid = request_id if request_id is not None else f"rejected-{id(prompt)}"
            ids = list(prompt) if not isinstance(prompt, str) else []
            failed = RequestOutput(
                request_id=rid,
                prompt_token_ids=[t for t in ids if isinstance(t, int)],
                finished=True,
                finish_reason="error",
                error=str(exc),
                metrics=RequestMetrics(arrival_time=0.0),
            )
            return rid, failed

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
        if self.pd is not None:
            return self.pd.generate([self._encode_or_error(p) for p in batch], params, spaces)
        order: list[str] = []
        done: dict[str, RequestOutput] = {}
        for i, (prompt, p, ns) in enumerate(zip(batch, params, spaces)):
            rid, failed = self._add(prompt, p, ns, f"gen-{id(self)}-{i}")
            order.append(rid)
            if failed is not None:
                done[rid] = failed
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(batch), desc="generate", unit="req")
        while self.engine.has_unfinished():
            for out in self.engine.step():
                if out.finished:
                    done[out.request_id] = out
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()
        return [done[rid] for rid in order]

    def stream(
        self,
        prompt: Prompt,
        sampling_params: SamplingParams | None = None,
        *,
        namespace: bytes = b"",
    ) -> Iterator[RequestOutput]:
        """Yield an output each time the request advances (``new_text`` holds the increment).

        Other requests already queued on this engine keep running alongside.
        """
        if self.pd is not None:
            ids = self._encode_or_error(prompt)
            params = sampling_params or SamplingParams()
            if isinstance(ids, Exception):
                yield self.pd.generate([ids], [params], [namespace])[0]
                return
            yield from self.pd.stream(ids, params, namespace)
            return
        rid, failed = self._add(prompt, sampling_params or SamplingParams(), namespace, None)
        if failed is not None:
            yield failed
            return
        while self.engine.has_unfinished():
            for out in self.engine.step():
                if out.request_id == rid:
                    yield out
                    if out.finished:
                        return

    def chat(
        self,
        messages: Seq[Mapping[str, Any]],
        sampling_params: SamplingParams | None = None,
        *,
        namespace: bytes = b"",
    ) -> RequestOutput:
        """Render ``messages`` with the model's chat template and generate the reply."""
        prompt = self.loaded.chat_template.render(messages, add_generation_prompt=True)
        ids = self.tokenizer.encode(prompt, add_bos=False)
        return self.generate([ids], sampling_params, namespace=namespace)[0]


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
