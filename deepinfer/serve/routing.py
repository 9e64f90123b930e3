"""Routing and admission with `deepinfer_sched`'s own policy objects, fed by live replicas.

The router is built by ``SchedulerConfig(router=...).build(cost_model)``, exactly as the
simulator builds it; the cost model behind ``ttft_estimate`` and TTFT admission is the mean of
the live replicas' fitted step times (:class:`LiveCostModel`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from deepinfer.serve.replica import block_key
from deepinfer.serve.replica_view import ReplicaView
from deepinfer_cache import DEFAULT_KEY_HASH, hash_token_blocks
from deepinfer_sched.policies import ROUTERS, SchedulerConfig, estimate_ttft
from deepinfer_sched.policies.base import AdmissionPolicy, InstanceView, Router


@dataclass(frozen=True)
class RoutedRequest:
    """A request as the policies read it (`deepinfer_sched.policies.RequestView`)."""

    request_id: int
    input_len: int
    output_len: int
    block_hashes: tuple[int, ...]
    tenant: str
    priority: int = 0


def prompt_hashes(
    prompt_ids: list[int],
    block_size: int,
    namespace: bytes,
    model: bytes = b"",
    *,
    key_hash: str = DEFAULT_KEY_HASH,
) -> tuple[int, ...]:
    """The prompt's chained block hashes as the replicas' prefix caches compute them
    (``model`` and ``key_hash``: the key material and block-key scheme their stores use, as
    each replica publishes them in its ``ready``)."""
    hashes = hash_token_blocks(prompt_ids, block_size, namespace, model=model, key_hash=key_hash)
    return tuple(block_key(h) for h in hashes)


class LiveCostModel:
    """``CostModelLike`` from the up replicas' fitted step times (their mean)."""

    def __init__(self, views: Callable[[], Sequence[ReplicaView]]) -> None:
        self._views = views

    def _coef(self) -> tuple[float, float, int]:
        vs = list(self._views())
        if not vs:
            return 0.005, 0.0005, 2048
        n = len(vs)
        return (
            sum(v.step_overhead_s for v in vs) / n,
            sum(v.step_s_per_token for v in vs) / n,
            min(v.max_batched_tokens for v in vs),
        )

    def prefill_time(self, new_tokens: int, cached_tokens: int) -> float:
        a, b, chunk = self._coef()
        return -(-max(new_tokens, 1) // chunk) * a + b * new_tokens

    def decode_step_time(self, batch_size: int, total_context_tokens: int) -> float:
        a, b, _ = self._coef()
        return a + b * batch_size

    def kv_transfer_time(self, num_tokens: int) -> float:
        return 0.0

    def ssd_fetch_time(self, num_tokens: int) -> float:
        return 0.0


class ReplicaRouter:
    """Pick a replica per request and apply admission, with the simulator's policy objects."""

    def __init__(
        self,
        name: str,
        views: Callable[[], Sequence[ReplicaView]],
        *,
        ttft_slo_s: float | None = None,
    ) -> None:
        if name not in ROUTERS:
            raise ValueError(f"router must be one of {ROUTERS}, got {name!r}")
        self.name = name
        self.cost_model = LiveCostModel(views)
        config = SchedulerConfig(
            router=name,
            admission=("ttft",) if ttft_slo_s else (),
            ttft_slo_s=ttft_slo_s,
        )
        policies = config.build(self.cost_model)
        self.router: Router = policies.router
        self.admission: tuple[AdmissionPolicy, ...] = policies.admission

    def route(self, request: RoutedRequest, candidates: Sequence[ReplicaView]) -> ReplicaView:
        chosen = self.router.route(request, candidates)
        if not isinstance(chosen, ReplicaView):
            raise TypeError(f"router returned {type(chosen).__name__}, not a candidate")
        return chosen

    def admit(self, request: RoutedRequest, chosen: InstanceView, now_s: float) -> str | None:
        """None to admit, else the rejecting policy's reason."""
        for policy in self.admission:
            reason = policy.check(
                request, now_s, lambda: estimate_ttft(request, chosen, self.cost_model)
            )
            if reason is not None:
                return reason
        return None
