"""`PDConfig`: how many prefill / decode worker processes PD mode runs and how it routes."""

from __future__ import annotations

from dataclasses import dataclass

from deepinfer_sched.policies.config import ROUTERS

PD_POLICIES = ("disaggregated", "per_request")
# Routers that work on what the coordinator knows: loads, and the prompts it handed each
# prefill worker (their prefix caches store them), but no cost model.
PD_ROUTERS = tuple(
    r for r in ROUTERS if r in ("round_robin", "least_loaded", "power_of_two", "prefix_affinity")
)


@dataclass(frozen=True)
class PDConfig:
    """Prefill/decode disaggregation settings for ``LLM(..., pd=PDConfig(...))``.

    ``policy``: ``"disaggregated"`` sends every prompt to a prefill worker and moves its KV to a
    decode worker; ``"per_request"`` prefills on the decode worker itself when the uncached part
    of the prompt is at most ``local_prefill_tokens`` (the transfer would cost more than it
    saves). ``router`` picks among prefill workers (a ``deepinfer_sched`` router name); the
    default ``"prefix_affinity"`` sends a prompt to the worker holding the longest cached
    prefix of it (a conversation's next turn goes back to the worker of its last one) unless
    that worker is overloaded, else to the least loaded.
    ``startup_timeout_s`` bounds model loading in a worker; ``request_timeout_s`` bounds how long
    the coordinator waits without hearing from any busy worker before it reports a failure.
    A worker that dies is started again; ``max_failed_starts`` consecutive starts that die
    before reporting ready take its slot out of service (PD mode stops only when no decode
    slot is left).

    Example::

        PDConfig(num_prefill_workers=1, num_decode_workers=1, policy="per_request")
    """

    num_prefill_workers: int = 1
    num_decode_workers: int = 1
    policy: str = "disaggregated"
    local_prefill_tokens: int = 32
    router: str = "prefix_affinity"
    worker_threads: int = 1
    startup_timeout_s: float = 120.0
    request_timeout_s: float = 120.0
    max_failed_starts: int = 3

    def __post_init__(self) -> None:
        for name in (
            "num_prefill_workers",
            "num_decode_workers",
            "worker_threads",
            "max_failed_starts",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.policy not in PD_POLICIES:
            raise ValueError(f"policy must be one of {PD_POLICIES}, got {self.policy!r}")
        if self.router not in PD_ROUTERS:
            raise ValueError(f"router must be one of {PD_ROUTERS}, got {self.router!r}")
        if not isinstance(self.local_prefill_tokens, int) or self.local_prefill_tokens < 0:
            raise ValueError(
                f"local_prefill_tokens must be an int >= 0, got {self.local_prefill_tokens!r}"
            )
        for name in ("startup_timeout_s", "request_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a number > 0, got {value!r}")

    @classmethod
    def coerce(cls, value: PDConfig | bool) -> PDConfig | None:
        """``True`` -> defaults, ``False`` -> off, a `PDConfig` as is."""
        if isinstance(value, PDConfig):
            return value
        if value is True:
            return cls()
        if value is False:
            return None
        raise TypeError(f"pd must be a PDConfig or a bool, got {type(value).__name__}")
