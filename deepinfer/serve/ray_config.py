"""`RayOptions`: how `deepinfer serve --ray` places its replicas on a Ray cluster.

This module never imports Ray: the options are parsed and validated (``deepinfer serve --help``
and `ServeConfig` work without the ``ray`` extra); Ray itself is imported only when a service
with ``ray`` options starts (`deepinfer.serve.ray_backend`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from dataclasses import dataclass, field
from typing import Any

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def _check_resources(name: str, value: dict[str, float]) -> None:
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a dict of resource name -> amount, got {value!r}")
    for key, amount in value.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"{name}: resource names must be non-empty strings, got {key!r}")
        if key in ("CPU", "GPU", "memory", "object_store_memory"):
            raise ValueError(
                f"{name}: {key!r} is set through num_cpus/num_gpus, not as a custom resource"
            )
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not amount > 0:
            raise ValueError(f"{name}[{key!r}] must be a number > 0, got {amount!r}")


@dataclass(frozen=True)
class RayOptions:
    """Placement of replica actors on a Ray cluster.

    ``address``: None starts a Ray instance in this process's machine (as ``ray.init()``
    does); ``"auto"`` joins the cluster ``ray start`` runs here; ``"ray://host:10001"`` or
    ``"host:6379"`` joins a remote one. If Ray is already initialised in this process (tests,
    notebooks) that connection is used and left open.
    ``num_cpus`` / ``num_gpus``: what each replica actor reserves (``num_gpus`` None: 1 when the
    replicas run on ``cuda``, else 0). ``resources``: custom resources every replica asks for;
    ``prefill_resources`` / ``decode_resources``: extra ones for the prefill and decode pools of
    ``--pd``, which is how a pool is pinned to a node group (``ray start --resources
    '{"prefill_node": 8}'`` on the prefill machines). Each pool is one placement group with a
    bundle per replica, placed with ``strategy``. ``max_restarts``: how often Ray restarts a
    replica actor that died (-1: always) before the server creates a fresh one.
    """

    address: str | None = None
    num_cpus: float = 1.0
    num_gpus: float | None = None
    resources: dict[str, float] = field(default_factory=dict)
    prefill_resources: dict[str, float] = field(default_factory=dict)
    decode_resources: dict[str, float] = field(default_factory=dict)
    strategy: str = "PACK"
    max_restarts: int = 3
    placement_timeout_s: float = 120.0
    namespace: str = "deepinfer"

    def __post_init__(self) -> None:
        if self.address is not None and (not isinstance(self.address, str) or not self.address):
            raise ValueError(
                f"address must be None, 'auto' or a cluster address, got {self.address!r}"
            )
        if isinstance(self.num_cpus, bool) or not isinstance(self.num_cpus, (int, float)):
            raise ValueError(f"num_cpus must be a number >= 0, got {self.num_cpus!r}")
        if self.num_cpus < 0:
            raise ValueError(f"num_cpus must be >= 0, got {self.num_cpus}")
        if self.num_gpus is not None and not (
            isinstance(self.num_gpus, (int, float)) and self.num_gpus >= 0
        ):
            raise ValueError(f"num_gpus must be None or a number >= 0, got {self.num_gpus!r}")
        _check_resources("resources", self.resources)
        _check_resources("prefill_resources", self.prefill_resources)
        _check_resources("decode_resources", self.decode_resources)
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if not isinstance(self.max_restarts, int) or self.max_restarts < -1:
            raise ValueError(f"max_restarts must be an int >= -1, got {self.max_restarts!r}")
        if not self.placement_timeout_s > 0:
            raise ValueError(f"placement_timeout_s must be > 0, got {self.placement_timeout_s}")

    def pool_resources(self, role: str) -> dict[str, float]:
        """The custom resources one replica of pool ``role`` (both/prefill/decode) asks for."""
        extra = {"prefill": self.prefill_resources, "decode": self.decode_resources}.get(role, {})
        return {**self.resources, **extra}

    def gpus_for(self, device: str) -> float:
        if self.num_gpus is not None:
            return float(self.num_gpus)
        return 1.0 if device.startswith("cuda") else 0.0


# ---------------------------------------------------------------------- command line
def add_ray_arguments(p: argparse.ArgumentParser) -> None:
    """The ``--ray*`` options of ``deepinfer serve``."""
    g = p.add_argument_group("Ray (replicas as actors of a Ray cluster; needs deepinfer[ray])")
    g.add_argument("--ray", action="store_true", help="run every replica as a Ray actor")
    g.add_argument(
        "--ray-address",
        default=None,
        help="'auto' (the cluster `ray start` runs here) or ADDRESS; default: a local Ray",
    )
    g.add_argument("--ray-num-cpus", type=float, default=1.0, help="CPUs per replica actor")
    g.add_argument("--ray-num-gpus", type=float, default=None, help="GPUs per replica actor")
    g.add_argument(
        "--ray-resources", default="{}", metavar="JSON", help="custom resources per replica"
    )
    g.add_argument(
        "--ray-prefill-resources",
        default="{}",
        metavar="JSON",
        help="extra custom resources of --pd prefill replicas (pins them to a node group)",
    )
    g.add_argument(
        "--ray-decode-resources",
        default="{}",
        metavar="JSON",
        help="extra custom resources of --pd decode replicas (pins them to a node group)",
    )
    g.add_argument(
        "--ray-strategy",
        default="PACK",
        choices=list(STRATEGIES),
        help="placement-group strategy of each pool",
    )
    g.add_argument(
        "--ray-max-restarts",
        type=int,
        default=3,
        help="Ray restarts of a dead replica actor before a fresh one (-1: always)",
    )


def _json_resources(flag: str, text: str) -> dict[str, float]:
    try:
        value: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"{flag}: expected a JSON object, got {text!r} ({exc})") from None
    if not isinstance(value, dict):
        raise SystemExit(f"{flag}: expected a JSON object like '{{\"node_a\": 1}}', got {text!r}")
    return value


def ray_installed() -> bool:
    """Whether Ray can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):
        return False


def ray_options_from_args(args: argparse.Namespace) -> RayOptions | None:
    """`RayOptions` from the parsed ``--ray*`` flags; None without ``--ray``."""
    if not getattr(args, "ray", False):
        if getattr(args, "ray_address", None) is not None:
            raise SystemExit("--ray-address needs --ray")
        return None
    if not ray_installed():
        raise SystemExit(
            "deepinfer serve --ray needs the 'ray' extra: pip install 'deepinfer[ray]'"
        )
    try:
        return RayOptions(
            address=args.ray_address,
            num_cpus=args.ray_num_cpus,
            num_gpus=args.ray_num_gpus,
            resources=_json_resources("--ray-resources", args.ray_resources),
            prefill_resources=_json_resources(
                "--ray-prefill-resources", args.ray_prefill_resources
            ),
            decode_resources=_json_resources("--ray-decode-resources", args.ray_decode_resources),
            strategy=args.ray_strategy,
            max_restarts=args.ray_max_restarts,
        )
    except ValueError as exc:
        raise SystemExit(f"--ray: {exc}") from None
