"""Prometheus metrics of one server (their own registry: no process-wide state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServeMetrics:
    """Gauges per replica, counters and latency histograms; ``render()`` is the text format."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.waiting = Gauge(
            "deepinfer_requests_waiting", "Requests queued for prefill", ["replica"], registry=r
        )
        self.running = Gauge(
            "deepinfer_requests_running",
            "Requests holding KV and decoding",
            ["replica"],
            registry=r,
        )
        self.kv_free = Gauge(
            "deepinfer_kv_blocks_free",
            "Free KV blocks in the replica's pool",
            ["replica"],
            registry=r,
        )
        self.up = Gauge(
            "deepinfer_replica_up", "1 when the replica serves", ["replica"], registry=r
        )
        self.restarts = Counter(
            "deepinfer_replica_restarts",
            "Replica restarts after a failure",
            ["replica"],
            registry=r,
        )
        self.requests = Counter(
            "deepinfer_requests", "Finished requests by outcome", ["outcome"], registry=r
        )
        self.routed = Counter(
            "deepinfer_router_decisions", "Requests routed per replica", ["replica"], registry=r
        )
        self.retried = Counter(
            "deepinfer_requests_retried", "Requests re-routed after their replica died", registry=r
        )
        self.prompt_tokens = Counter("deepinfer_prompt_tokens", "Prompt tokens", registry=r)
        self.generation_tokens = Counter(
            "deepinfer_generation_tokens", "Generated tokens", registry=r
        )
        self.prefix_hit_tokens = Counter(
            "deepinfer_prefix_hit_tokens",
            "Prompt tokens served by the prefix cache",
            ["tier"],
            registry=r,
        )
        self.ttft = Histogram(
            "deepinfer_time_to_first_token_seconds",
            "Time to first token",
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.itl = Histogram(
            "deepinfer_inter_token_latency_seconds",
            "Time between streamed tokens",
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.accepted = Histogram(
            "deepinfer_spec_accepted_length",
            "Tokens emitted per speculative step (DSpark)",
            registry=r,
            buckets=(1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0),
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
