"""Synthetic chat + agent conversation traces with shared system prompts and growing histories.

Model (all draws from one ``numpy.random.Generator`` seeded by ``config.seed``):

- A pool of ``num_system_prompts`` system prompts, each owned by one tenant and one kind
  (chat or agent); a conversation picks a prompt of its kind with Zipf(``prompt_zipf``)
  popularity, so popular prompts are shared by many conversations.
- A conversation has ``T ~ Geometric(mean_turns)`` turns. Turn ``k`` sends
  ``input_k = S + sum_{j<k} (u_j + o_j) + u_k`` tokens: the system prompt ``S``, the whole
  history (earlier user messages ``u_j`` and replies ``o_j``) and the new message ``u_k``.
  Token counts are lognormal (median, sigma). A conversation ends early at the first turn
  whose input would exceed ``max_input_len`` (the model's context window).
- Turn gaps are lognormal "real" seconds divided by ``time_scale``; turns later than the
  kind's lifetime (7 days chat, 3 days agent, also divided by ``time_scale``) are dropped,
  as the production cache would have expired the conversation by then.
- Conversation starts follow the arrival process (Poisson, gamma or MMPP) at the rate that
  makes the request rate ``request_rate``; the trace is the first ``num_requests`` requests.
  A trace starts with no conversation in flight, so start times are scaled by the largest
  factor ``s`` that still fits ``num_requests`` requests into ``num_requests /
  request_rate`` seconds (``s < 1`` for short traces): the realised mean rate is
  ``request_rate`` (for MMPP the dwell times scale by the same ``s``).

Block ids: a prompt's full blocks get ids shared by every conversation using it; every later
block of a conversation gets an id unique to the conversation (chained: equal prefixes share
leading ids). With the defaults the mean input is about 77k tokens and about 96% of input
tokens are reusable (``Trace.stats().reusable_fraction``).
"""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from deepinfer_sched.traces.arrivals import ARRIVAL_PROCESSES, arrival_times
from deepinfer_sched.traces.types import Trace, TraceRequest

__all__ = ["SyntheticTraceConfig", "synthetic_trace"]

_DAY_S = 86_400.0
_IntArray = npt.NDArray[np.int64]
_FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class SyntheticTraceConfig:
    """Knobs of the synthetic generator (see the module doc for the model).

    Token counts and turn gaps are ``(median, lognormal sigma)`` pairs; gaps are in real
    seconds (divided by ``time_scale``). ``burstiness`` is the squared coefficient of
    variation of gaps for ``arrival="gamma"`` and the high/low rate ratio for ``"mmpp"``.
    ``chat_priority``/``agent_priority`` are copied into each request's ``priority``.
    """

    num_requests: int = 10_000
    request_rate: float = 10.0
    seed: int = 0
    block_size: int = 512
    agent_fraction: float = 0.5
    arrival: str = "poisson"
    burstiness: float = 4.0
    mmpp_dwell_s: float = 60.0
    time_scale: float = 100.0
    chat_lifetime_s: float = 7 * _DAY_S
    agent_lifetime_s: float = 3 * _DAY_S
    num_tenants: int = 8
    num_system_prompts: int = 64
    prompt_zipf: float = 1.0
    chat_mean_turns: float = 60.0
    agent_mean_turns: float = 100.0
    chat_system_tokens: tuple[float, float] = (8_000.0, 0.5)
    agent_system_tokens: tuple[float, float] = (15_000.0, 0.5)
    chat_first_tokens: tuple[float, float] = (20_000.0, 1.2)
    agent_first_tokens: tuple[float, float] = (30_000.0, 1.0)
    chat_user_tokens: tuple[float, float] = (800.0, 1.2)
    agent_user_tokens: tuple[float, float] = (800.0, 1.0)
    chat_output_tokens: tuple[float, float] = (600.0, 0.8)
    agent_output_tokens: tuple[float, float] = (300.0, 0.8)
    chat_turn_gap_s: tuple[float, float] = (300.0, 1.5)
    agent_turn_gap_s: tuple[float, float] = (30.0, 1.5)
    max_input_len: int = 131_072
    max_output_len: int = 8_192
    chat_priority: int = 0
    agent_priority: int = 0

    def __post_init__(self) -> None:
        if self.num_requests < 0:
            raise ValueError(f"num_requests must be >= 0, got {self.num_requests}")
        for name in (
            "request_rate",
            "time_scale",
            "chat_lifetime_s",
            "agent_lifetime_s",
            "mmpp_dwell_s",
            "prompt_zipf",
        ):
            v = getattr(self, name)
            if not (v > 0.0 and math.isfinite(v)):
                raise ValueError(f"{name} must be finite and > 0, got {v}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if not 0.0 <= self.agent_fraction <= 1.0:
            raise ValueError(f"agent_fraction must be in [0, 1], got {self.agent_fraction}")
        if self.arrival not in ARRIVAL_PROCESSES:
            raise ValueError(f"arrival must be one of {ARRIVAL_PROCESSES}, got {self.arrival!r}")
        if not (self.burstiness >= 1.0 and math.isfinite(self.burstiness)):
            raise ValueError(f"burstiness must be finite and >= 1, got {self.burstiness}")
        if self.num_tenants < 1 or self.num_system_prompts < 2:
            raise ValueError("num_tenants must be >= 1 and num_system_prompts >= 2")
        for name in ("chat_mean_turns", "agent_mean_turns"):
            if not getattr(self, name) >= 1.0:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in (
            "chat_system_tokens",
            "agent_system_tokens",
            "chat_first_tokens",
            "agent_first_tokens",
            "chat_user_tokens",
            "agent_user_tokens",
            "chat_output_tokens",
            "agent_output_tokens",
            "chat_turn_gap_s",
            "agent_turn_gap_s",
        ):
            v = getattr(self, name)
            if len(v) != 2 or not (v[0] > 0.0 and v[1] >= 0.0):
                raise ValueError(f"{name} must be (median > 0, sigma >= 0), got {v}")
        if self.max_output_len < 1:
            raise ValueError(f"max_output_len must be >= 1, got {self.max_output_len}")
        if self.max_input_len < 1:
            raise ValueError(f"max_input_len must be >= 1, got {self.max_input_len}")


def _lognormal(
    rng: np.random.Generator,
    is_agent: npt.NDArray[np.bool_],
    chat: tuple[float, float],
    agent: tuple[float, float],
) -> _FloatArray:
    mu = np.where(is_agent, math.log(agent[0]), math.log(chat[0]))
    sigma = np.where(is_agent, agent[1], chat[1])
    return np.asarray(np.exp(mu + sigma * rng.standard_normal(is_agent.shape[0])))


def _group_exclusive_cumsum(
    values: _IntArray | _FloatArray, starts: _IntArray, counts: _IntArray
) -> npt.NDArray[np.float64]:
    """Per-group exclusive prefix sums of a flat array laid out group after group."""
    c = np.cumsum(values, dtype=np.float64)
    excl = c - values
    return np.asarray(excl - np.repeat(excl[starts], counts))


@dataclass(frozen=True)
class _Conversations:
    conv: _IntArray  # conversation of each kept turn
    turn: _IntArray
    start: _FloatArray  # conversation start of each kept turn (before time fitting)
    offset: _FloatArray  # turn time after its conversation start
    arrival: _FloatArray  # start * scale + offset, set by _fit_scale
    input_len: _IntArray
    output_len: _IntArray
    prompt: _IntArray  # per conversation
    is_agent: npt.NDArray[np.bool_]  # per conversation
    last_start: float


def _generate(
    cfg: SyntheticTraceConfig,
    num_convs: int,
    prompt_len: _IntArray,
    prompt_agent: npt.NDArray[np.bool_],
    rng: np.random.Generator,
) -> _Conversations:
    c = num_convs
    is_agent = rng.random(c) < cfg.agent_fraction
    # Zipf popularity over each kind's prompt pool.
    prompt = np.empty(c, dtype=np.int64)
    for flag in (False, True):
        pool = np.flatnonzero(prompt_agent == flag)
        sel = is_agent == flag
        if not sel.any():
            continue
        w = 1.0 / np.arange(1, pool.size + 1, dtype=np.float64) ** cfg.prompt_zipf
        prompt[sel] = pool[rng.choice(pool.size, size=int(sel.sum()), p=w / w.sum())]
    mean_turns = np.where(is_agent, cfg.agent_mean_turns, cfg.chat_mean_turns)
    turns = rng.geometric(1.0 / mean_turns).astype(np.int64)
    starts_idx = np.concatenate(([0], np.cumsum(turns)[:-1])).astype(np.int64)
    total = int(turns.sum())
    conv = np.repeat(np.arange(c, dtype=np.int64), turns)
    turn = np.arange(total, dtype=np.int64) - np.repeat(starts_idx, turns)
    agent_t = is_agent[conv]
    first = turn == 0
    user = np.where(
        first,
        _lognormal(rng, agent_t, cfg.chat_first_tokens, cfg.agent_first_tokens),
        _lognormal(rng, agent_t, cfg.chat_user_tokens, cfg.agent_user_tokens),
    )
    user = np.maximum(1, np.rint(user)).astype(np.int64)
    out = _lognormal(rng, agent_t, cfg.chat_output_tokens, cfg.agent_output_tokens)
    out = np.clip(np.rint(out), 1, cfg.max_output_len).astype(np.int64)
    history = _group_exclusive_cumsum(user + out, starts_idx, turns).astype(np.int64)
    inp = prompt_len[prompt[conv]] + history + user
    gaps = _lognormal(rng, agent_t, cfg.chat_turn_gap_s, cfg.agent_turn_gap_s) / cfg.time_scale
    gaps[first] = 0.0
    offset = _group_exclusive_cumsum(gaps, starts_idx, turns) + gaps
    lifetime = np.where(agent_t, cfg.agent_lifetime_s, cfg.chat_lifetime_s) / cfg.time_scale
    # A turn over the context window ends its conversation (so do all later turns); a turn
    # past the lifetime is dropped (gaps are positive, so later turns are dropped too).
    bad = (inp > cfg.max_input_len).astype(np.int64)
    bad_before = _group_exclusive_cumsum(bad, starts_idx, turns) + bad
    keep = (bad_before == 0) & (offset <= lifetime)
    kept_per_conv = np.bincount(conv[keep], minlength=c)
    mean_kept = max(1.0, float(kept_per_conv.mean()))
    conv_starts = arrival_times(
        rng, c, cfg.request_rate / mean_kept, cfg.arrival, cfg.burstiness, cfg.mmpp_dwell_s
    )
    arrival = conv_starts[conv] + offset
    return _Conversations(
        conv=conv[keep],
        turn=turn[keep],
        start=conv_starts[conv][keep],
        offset=offset[keep],
        arrival=arrival[keep],
        input_len=inp[keep],
        output_len=out[keep],
        prompt=prompt,
        is_agent=is_agent,
        last_start=float(conv_starts[-1]) if c else 0.0,
    )


def _fit_scale(convs: _Conversations, horizon: float, n: int) -> float:
    """Largest factor ``s`` on conversation start times leaving at least ``n`` requests by
    ``horizon = n / request_rate``, so the ``n``-th request arrives at about ``horizon``.

    Conversations last a while, so a trace that starts empty ramps up (``s < 1`` compresses
    the starts to compensate); a random surplus of early requests gives ``s > 1``. Either
    way the realised mean rate is ``request_rate``.
    """

    def count(s: float) -> int:
        return int(np.count_nonzero(convs.start * s + convs.offset <= horizon))

    lo, hi = 0.0, 1.0  # count(0) >= n is checked by the caller's validity test
    while count(hi) >= n and hi < 1e6:
        lo, hi = hi, hi * 2.0
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        if count(mid) >= n:
            lo = mid
        else:
            hi = mid
    return lo


def synthetic_trace(config: SyntheticTraceConfig | None = None) -> Trace:
    """Generate a deterministic synthetic trace (same config -> identical trace).

    Example::

        trace = synthetic_trace(SyntheticTraceConfig(num_requests=1000, seed=1))
        print(trace.stats().mean_input_len, trace.stats().reusable_fraction)
    """
    cfg = config if config is not None else SyntheticTraceConfig()
    n = cfg.num_requests
    bs = cfg.block_size
    if n == 0:
        return Trace((), bs, "synthetic")
    p = cfg.num_system_prompts
    pool_rng = np.random.default_rng([cfg.seed, 0])
    prompt_agent = np.arange(p) % 2 == 1
    if cfg.agent_fraction == 0.0:
        prompt_agent[:] = False
    elif cfg.agent_fraction == 1.0:
        prompt_agent[:] = True
    prompt_len = np.maximum(
        1,
        np.rint(
            _lognormal(pool_rng, prompt_agent, cfg.chat_system_tokens, cfg.agent_system_tokens)
        ),
    ).astype(np.int64)
    prompt_tenant = np.arange(p) % cfg.num_tenants
    mean_turns = (1.0 - cfg.agent_fraction) * cfg.chat_mean_turns + (
        cfg.agent_fraction * cfg.agent_mean_turns
    )
    num_convs = int(1.2 * n / mean_turns) + 64
    attempt = 0
    while True:
        # A fresh generator per attempt keeps the result a pure function of the config.
        convs = _generate(
            cfg, num_convs, prompt_len, prompt_agent, np.random.default_rng([cfg.seed, 1, attempt])
        )
        horizon = n / cfg.request_rate
        scale = _fit_scale(convs, horizon, n)
        # Valid once some conversation starts after the horizon: none that could send a
        # request before it is missing.
        if scale * convs.last_start > horizon:
            convs = replace(convs, arrival=convs.start * scale + convs.offset)
            break
        # Context-window truncation keeps fewer turns than the nominal mean; size the next
        # attempt from the turns actually kept.
        kept = max(1.0, convs.conv.shape[0] / num_convs)
        num_convs = max(int(num_convs * 1.25), int(1.1 * n / kept)) + 64
        attempt += 1
    order = np.lexsort((convs.turn, convs.conv, convs.arrival))[:n]
    # Building millions of small objects triggers repeated full cyclic-GC passes that find
    # nothing (the objects are acyclic); pausing the collector halves the time.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _build(cfg, convs, order, prompt_len, prompt_tenant)
    finally:
        if was_enabled:
            gc.enable()


def _build(
    cfg: SyntheticTraceConfig,
    convs: _Conversations,
    order: _IntArray,
    prompt_len: _IntArray,
    prompt_tenant: _IntArray,
) -> Trace:
    bs = cfg.block_size
    conv_sel = convs.conv[order]
    full_blocks = convs.input_len[order] // bs
    # Prompt blocks first, then each selected conversation's own blocks, numbered densely.
    prompt_full = prompt_len // bs
    prompt_base = np.concatenate(([0], np.cumsum(prompt_full)[:-1])) + 1
    max_full = np.zeros(convs.prompt.shape[0], dtype=np.int64)
    np.maximum.at(max_full, conv_sel, full_blocks)
    own = np.maximum(0, max_full - prompt_full[convs.prompt])
    conv_base = np.concatenate(([0], np.cumsum(own)[:-1])) + int(prompt_full.sum()) + 1
    prompt_ids = [
        tuple(range(int(b), int(b) + int(k)))
        for b, k in zip(prompt_base.tolist(), prompt_full.tolist())
    ]
    tenants = [f"tenant-{t}" for t in range(cfg.num_tenants)]
    conv_ids: dict[int, tuple[int, ...]] = {}
    arrival = convs.arrival[order].tolist()
    inp = convs.input_len[order].tolist()
    out = convs.output_len[order].tolist()
    fb = full_blocks.tolist()
    conv_list = conv_sel.tolist()
    prompts = convs.prompt.tolist()
    conv_tenant = [tenants[t] for t in prompt_tenant[convs.prompt].tolist()]
    conv_kind = ["agent" if a else "chat" for a in convs.is_agent.tolist()]
    conv_prio = [cfg.agent_priority if a else cfg.chat_priority for a in convs.is_agent.tolist()]
    base_list = conv_base.tolist()
    own_list = own.tolist()
    reqs: list[TraceRequest] = []
    append = reqs.append
    for i, c in enumerate(conv_list):
        ids = conv_ids.get(c)
        if ids is None:
            b = base_list[c]
            ids = prompt_ids[prompts[c]] + tuple(range(b, b + own_list[c]))
            conv_ids[c] = ids
        # Positional: request_id, arrival_s, input_len, output_len, block_hashes, tenant,
        # conversation_id, kind, priority.
        append(
            TraceRequest(
                i,
                arrival[i],
                inp[i],
                out[i],
                ids[: fb[i]],
                conv_tenant[c],
                c,
                conv_kind[c],
                conv_prio[c],
            )
        )
    return Trace(tuple(reqs), bs, "synthetic")
