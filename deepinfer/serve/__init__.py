"""deepinfer.serve: the OpenAI-compatible online service (``deepinfer serve``).

An HTTP front (FastAPI + uvicorn, SSE streaming, Prometheus metrics) over N engine replicas,
each in its own process, routed per request by the same `deepinfer_sched` router objects the
simulator uses, fed by the replicas' live load and prefix-cache events. The HTTP parts need the
``serve`` extra (``pip install deepinfer[serve]``); they are imported on first use, so the
``deepinfer`` command works without it.

Example::

    import uvicorn
    from deepinfer.serve import ServeConfig, ServeService, build_app

    service = ServeService(ServeConfig(replicas=2, router="prefix_affinity"))
    uvicorn.run(build_app(service), host="127.0.0.1", port=8000)
"""

from __future__ import annotations

import importlib
from typing import Any

from deepinfer.serve.config import ServeConfig
from deepinfer.serve.ray_config import RayOptions
from deepinfer.serve.server import add_serve_parser, run_server

# Names whose modules import fastapi / prometheus-client (the ``serve`` extra).
_LAZY = {
    "APIError": "deepinfer.serve.errors",
    "Delta": "deepinfer.serve.request_stream",
    "ServeService": "deepinfer.serve.service",
    "build_app": "deepinfer.serve.app",
}

__all__ = [
    "APIError",
    "Delta",
    "RayOptions",
    "ServeConfig",
    "ServeService",
    "add_serve_parser",
    "build_app",
    "run_server",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'deepinfer.serve' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
