"""The body of one serving replica: an engine stepping in its own process (or thread).

The replica receives JSON messages on its end of a pipe (no pickle crosses it)::

    {"op": "add", "request_id", "prompt_ids", "params", "namespace"}   queue a request
                                                 (``n``/``best_of`` fan out into candidates)
    {"op": "abort", "request_id"}                                     drop it, free its KV
    {"op": "prefill", ...} / {"op": "decode", ..., "kv"}              PD roles (replica_pd.py)
    {"op": "shutdown"}                                                flush the cache, exit

and answers with ``info`` and ``ready`` once its engine is built (``fatal`` if that fails),
``output`` per request step (per candidate: ``index`` says which of a request's ``n``/``best_of``
completions advanced; the new tokens' ``logprobs`` when asked, see `deepinfer.serve.logprobs`;
the engine's ``finish_reason`` / ``stop_reason``, stop strings included), ``rejected`` for a
request the engine refused, and ``state``
whenever its load or prefix cache changed: queue and KV figures, a fitted step-time model, and
the prefix cache's store/evict events (block hashes from the store's event subscription, as
vLLM's KV events give cache-aware routers) so the front's router sees what this replica holds.
The first ``state`` (and one after an event overflow) carries the whole set with ``reset``.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import traceback
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import torch

from deepinfer.engine.engine import LLMEngine
from deepinfer.engine.fanout import fan_out
from deepinfer.engine.outputs import RequestOutput
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.pd.messages import recv, send
from deepinfer.profile import StepRecorder, write_profile
from deepinfer.serve.logprobs import to_wire
from deepinfer.serve.replica_pd import KVTransport, PDRole
from deepinfer.serve.step_model import StepTimeFit
from deepinfer_cache import DEFAULT_KEY_HASH, AllBlocksCleared, BlockStored

IDLE_POLL_S = 0.5  # wake up this often while idle to notice a vanished front
STATE_EVERY_S = 0.02  # at most this often a load update while busy


@dataclass(frozen=True)
class ReplicaSettings:
    """What a replica is started with, sent as one JSON string."""

    model: str | None
    index: int = 0
    dtype: str = "float32"
    device: str = "cpu"
    engine: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, Any] | None = None
    speculative: str | dict[str, Any] = ""  # a SpeculativeConfig crosses as its dict
    threads: int = 1
    cache_dir: str | None = None
    profile_out: str | None = None  # write the live step profile here on shutdown

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ReplicaSettings:
        return cls(**json.loads(text))


def replica_profile_path(path: str | None, index: int) -> str | None:
    """Where replica ``index`` writes its live step profile: ``path`` with ``-replica-<i>``
    before the extension (``live.json`` -> ``live-replica-0.json``)."""
    if not path:
        return None
    root, ext = os.path.splitext(path)
    return f"{root}-replica-{index}{ext or '.json'}"


def block_key(h: bytes) -> int:
    """A 16-byte cache block hash shortened to the 64-bit id the routers compare."""
    return int.from_bytes(h[:8], "big")


class Replica:
    """One engine plus the bookkeeping the front needs from it."""

    def __init__(
        self, conn: Connection, engine: LLMEngine, store: Any, transport: KVTransport | None = None
    ) -> None:
        self.conn = conn
        self.engine = engine
        self.store = store
        self.fit = StepTimeFit()
        self.steps = StepRecorder()
        # request id -> [received, first token] (perf_counter) for the live profile
        self._times: dict[str, list[float]] = {}
        self.pd = PDRole(engine, transport)
        self._events = store.subscribe() if store is not None else None
        self._resync = True
        self._last_load: tuple[int, ...] = ()
        self._last_sent = 0.0
        # n / best_of: engine request id of a candidate -> (request id, candidate index), and
        # a request's candidates still running (one-candidate requests keep their own id).
        self._candidate: dict[str, tuple[str, int]] = {}
        self._running: dict[str, set[str]] = {}
        # Requests received since the last state message (its ``seen``): the front counts a
        # request it routed here as queued until a report says it arrived.
        self._seen: list[str] = []

    # ------------------------------------------------------------------ messages
    def on_message(self, message: dict[str, Any]) -> None:
        op = message["op"]
        if op in ("add", "prefill", "decode"):
            self._seen.append(str(message["request_id"]))
        if op == "add":
            self.add(message)
        elif op == "abort":
            rid = str(message["request_id"])
            self._times.pop(rid, None)
            for cid in self._running.pop(rid, {rid}):
                self._candidate.pop(cid, None)
                self.engine.abort(cid)
            self.pd.abort(rid)
        elif op == "prefill":
            try:
                self.pd.start_prefill(message)
            except (ValueError, TypeError) as exc:
                rid = str(message["request_id"])
                send(self.conn, {"op": "rejected", "request_id": rid, "error": str(exc)})
        elif op == "decode":
            self.pd.pending.append(message)
            self.admit_decodes()
        else:
            raise ValueError(f"replica got unknown op {op!r}")

    def add(self, message: dict[str, Any]) -> None:
        """Queue a request: one engine request per candidate (``fan_out``, as `LLM.generate`
        does, so candidate ``i`` of a seeded request draws with ``seed + i``). If the engine
        refuses one candidate, none runs."""
        rid = str(message["request_id"])
        added: list[str] = []
        try:
            children = fan_out(SamplingParams.from_json_dict(message["params"]))
            ids = [rid] if len(children) == 1 else [f"{rid}#{i}" for i in range(len(children))]
            for cid, params in zip(ids, children):
                self.engine.add_request(
                    [int(t) for t in message["prompt_ids"]],
                    params,
                    request_id=cid,
                    namespace=bytes.fromhex(message.get("namespace", "")),
                )
                added.append(cid)
        except (ValueError, TypeError) as exc:
            for cid in added:
                self.engine.abort(cid)
            send(self.conn, {"op": "rejected", "request_id": rid, "error": str(exc)})
            return
        # From the front's dispatch: a request waiting in the pipe for a step to end is queued.
        self._times[rid] = [float(message.get("sent_s", time.perf_counter())), 0.0]
        if len(ids) > 1:
            self._running[rid] = set(ids)
            self._candidate.update({cid: (rid, i) for i, cid in enumerate(ids)})

    def admit_decodes(self) -> None:
        for result in self.pd.admit_decodes():
            if isinstance(result, RequestOutput):
                self.on_output(result)
            else:
                rid, error = result
                send(self.conn, {"op": "rejected", "request_id": rid, "error": error})

    def on_output(self, out: RequestOutput) -> None:
        if out.request_id in self.pd.prefilling:
            handoff = self.pd.finish_prefill(out)
            if handoff is not None:
                send(self.conn, handoff)
                return
        send(self.conn, self.output_message(out))

    def output_message(self, out: RequestOutput) -> dict[str, Any]:
        """The ``output`` message of one engine output (a candidate's, with its index)."""
        rid, index = self._candidate.get(out.request_id, (out.request_id, 0))
        if out.finished and rid in self._running:
            self._candidate.pop(out.request_id, None)
            running = self._running[rid]
            running.discard(out.request_id)
            if not running:
                del self._running[rid]
        m = out.metrics
        c = out.outputs[0]
        new = len(out.new_token_ids)
        times = self._times.get(rid)
        if times is not None:
            now = time.perf_counter()
            if new and not times[1]:
                times[1] = now
            if out.finished and rid not in self._running:
                del self._times[rid]
                if times[1]:
                    cached = m.num_cached_tokens if m else 0
                    self.steps.request(times[0], times[1], now, len(out.prompt_token_ids), cached)
        logprobs = None
        if c.logprobs is not None:
            logprobs = to_wire(c.logprobs[len(c.logprobs) - new :] if new else [])
        return {
            "op": "output",
            "request_id": rid,
            "index": index,
            "new_token_ids": list(out.new_token_ids),
            "new_text": out.new_text,
            "num_tokens": len(out.token_ids),
            "finished": out.finished,
            "finish_reason": out.finish_reason,
            "stop_reason": c.stop_reason,
            "cumulative_logprob": c.cumulative_logprob,
            "logprobs": logprobs,
            "error": out.error,
            "prompt_tokens": len(out.prompt_token_ids),
            "cached_tokens": m.num_cached_tokens if m else 0,
            "spec": [m.num_spec_steps, m.num_accepted_drafts] if m else [0, 0],
        }

    # ------------------------------------------------------------------ state
    def load(self) -> dict[str, Any]:
        e = self.engine
        bs = e.config.block_size
        free = e.pool.num_free_blocks
        return {
            "num_waiting": len(e.waiting),
            "waiting_tokens": sum(s.prefill_target - s.num_computed for s in e.waiting),
            "num_running": len(e.running),
            "kv_used_tokens": max(0, e.capacity_blocks - free) * bs,
            "free_blocks": free,
        }

    def publish(self, force: bool = False) -> None:
        """Send a ``state`` message if the load or the cached blocks changed."""
        now = time.perf_counter()
        if not force and now - self._last_sent < STATE_EVERY_S and self.engine.has_unfinished():
            return
        load = self.load()
        key = tuple(load.values())
        stored, evicted, reset = self.cache_events()
        unchanged = key == self._last_load and not stored and not evicted and not reset
        if not force and unchanged and not self._seen:
            return
        self._last_load = key
        self._last_sent = now
        a, b = self.fit.coefficients()
        tier_hits = (
            {t.name: t.hit_tokens for t in self.store.stats().tiers}
            if self.store is not None
            else {}
        )
        send(
            self.conn,
            {
                "op": "state",
                **load,
                "step_overhead_s": a,
                "step_s_per_token": b,
                "stored": stored,
                "evicted": evicted,
                "reset": reset,
                "tier_hits": tier_hits,
                "seen": self._seen,
            },
        )
        self._seen = []

    def cache_events(self) -> tuple[list[int], list[int], bool]:
        """Blocks stored and removed since the last call (net, in event order), or the whole
        set with ``reset`` at start, after ``clear()`` or when events overflowed."""
        if self._events is None:
            return [], [], False
        present: dict[int, bool] = {}
        reset = False
        if self._resync or self._events.overflowed:
            self._events.overflowed = False
            self._events.poll()
            self._resync = False
            reset = True
            present = {block_key(h): True for h in self.store.block_hashes()}
        for event in self._events.poll():
            if isinstance(event, AllBlocksCleared):
                present, reset = {}, True
                continue
            there = isinstance(event, BlockStored)
            for h in event.hashes:
                present[block_key(h)] = there
        stored = [h for h, there in present.items() if there]
        evicted = [h for h, there in present.items() if not there]
        return stored, evicted, reset

    # ------------------------------------------------------------------ loop
    def run(self) -> None:
        e = self.engine
        while True:
            busy = e.has_unfinished() or self.pd.busy()
            top = time.perf_counter()
            timeout = 0.0 if busy else IDLE_POLL_S
            while self.conn.poll(timeout):
                message = recv(self.conn)
                if message["op"] == "shutdown":
                    return
                self.on_message(message)
                timeout = 0.0
            if not busy:
                top = time.perf_counter()  # waiting idle for a request is no step's cost
            if self.pd.busy():
                self.admit_decodes()
            self.publish()
            if e.has_unfinished():
                before = e.num_forward_tokens
                t0 = time.perf_counter()
                outs = e.step()
                dt = time.perf_counter() - t0
                if e.num_forward_tokens > before:
                    self.fit.add(e.num_forward_tokens - before, dt)
                for out in outs:
                    self.on_output(out)
                # The live profile times the whole loop iteration (messages taken in, state
                # published, the step, outputs sent, and any time the OS ran something else
                # meanwhile): that is the cadence the simulator's iteration stands for.
                self.steps.record(e.last_chunks, time.perf_counter() - top)
                if not e.has_unfinished():
                    self.publish(force=True)


def _warm_up(engine: LLMEngine) -> None:
    """Pay one-off costs (lazy imports, first kernels) before reporting ready."""
    engine.add_request(
        [0], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True), request_id="warmup"
    )
    while engine.has_unfinished():
        engine.step()


def build_replica_engine(settings: ReplicaSettings) -> tuple[LLMEngine, Any]:
    # Imported here: the front imports this module for ReplicaSettings and never builds.
    from deepinfer.builder import build_engine_from_settings

    built = build_engine_from_settings(
        settings.model,
        dtype=settings.dtype,
        device=settings.device,
        engine=settings.engine,
        cache=settings.cache,
        speculative=settings.speculative,
        cache_dir=settings.cache_dir,
    )
    return built.engine, built.store


def replica_main(
    conn: Connection,
    settings_json: str,
    set_threads: bool = True,
    transport: KVTransport | None = None,
) -> None:
    """Entry point of a replica process (``set_threads`` False when run as a thread;
    ``transport`` moves PD KV pages, shared memory by default)."""
    store = None
    try:
        settings = ReplicaSettings.from_json(settings_json)
        if set_threads:
            torch.set_num_threads(settings.threads)
        engine, store = build_replica_engine(settings)
        _warm_up(engine)
    except Exception as exc:  # report a start-up failure instead of dying silently
        with contextlib.suppress(OSError):
            send(conn, {"op": "fatal", "error": f"{type(exc).__name__}: {exc}"})
        if store is not None:
            store.close()
        return
    replica = Replica(conn, engine, store, transport)
    try:
        send(
            conn,
            {
                "op": "ready",
                "capacity_blocks": engine.capacity_blocks,
                "block_size": engine.config.block_size,
                "max_model_len": engine.max_model_len,
                "max_batched_tokens": engine.config.max_batched_tokens,
                "vocab_size": engine.model.config.vocab_size,
                # The key material the store folds into its block hashes (the front hashes
                # prompts the same way to ask the routers which replica holds a prefix).
                "hash_model": store.model.hex() if store is not None else "",
                "key_hash": store.key_hash if store is not None else DEFAULT_KEY_HASH,
            },
        )
        replica.publish(force=True)
        replica.run()
    except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
        pass  # the front went away
    except Exception as exc:
        with contextlib.suppress(OSError):
            send(
                conn,
                {
                    "op": "fatal",
                    "error": f"{type(exc).__name__}: {exc}",
                    "trace": traceback.format_exc(),
                },
            )
    finally:
        if settings.profile_out:
            with contextlib.suppress(OSError, ValueError):
                write_profile(
                    replica.steps.profile(engine, settings.model or ""), settings.profile_out
                )
        replica.pd.shutdown()
        if replica._events is not None:
            replica._events.close()
        if store is not None:
            store.close()  # write-back tiers persist to disk; the directory lock is released
        with contextlib.suppress(OSError):
            conn.close()
