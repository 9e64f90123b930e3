"""`deepinfer serve`: argument parsing and the uvicorn server with a draining SIGTERM.

The first SIGTERM (or Ctrl-C) starts a drain: new requests get 503, in-flight ones may finish
for ``--drain-timeout`` seconds and are then aborted, every replica flushes its prefix cache's
disk tier and exits, then the server stops. A second signal stops at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from types import FrameType
from typing import Any

from deepinfer.cli_options import add_prefix_cache_args
from deepinfer.engine.cache_setup import PrefixCacheConfig
from deepinfer.engine.config import EngineConfig, SpeculativeConfig
from deepinfer.serve.config import ServeConfig
from deepinfer.serve.ray_config import add_ray_arguments, ray_options_from_args
from deepinfer_sched.policies import ROUTERS


def add_serve_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``serve`` on the ``deepinfer`` command's subparsers."""
    p: argparse.ArgumentParser = sub.add_parser(
        "serve", help="OpenAI-compatible HTTP server over engine replicas"
    )
    p.add_argument("model", nargs="?", default=None, help="GGUF file or model directory")
    p.add_argument("--model", dest="model_opt", default=None, help=argparse.SUPPRESS)
    p.add_argument("--served-model-name", default=None, help="model id clients must send")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--replicas", type=int, default=1, help="engine replicas (processes)")
    p.add_argument("--router", default="cost", choices=list(ROUTERS))
    p.add_argument(
        "--pd", default=None, metavar="P:D", help="P prefill + D decode replicas (not --replicas)"
    )
    p.add_argument("--speculative", default=None, help="'dspark' or a drafter checkpoint dir")
    p.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=None,
        metavar="K",
        help="verify K drafts per step (default: DSpark's scheduler picks per step)",
    )
    p.add_argument(
        "--no-draft-gate",
        action="store_true",
        help="draft on every step, even where this machine's profile says it does not pay",
    )
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--num-blocks", type=int, default=2048, help="KV blocks per replica")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--threads", type=int, default=1, help="torch threads per replica")
    add_prefix_cache_args(p)
    p.add_argument("--ttft-slo", type=float, default=None, help="429 above this predicted TTFT")
    p.add_argument("--max-waiting", type=int, default=None, help="429 above this queue length")
    p.add_argument("--drain-timeout", type=float, default=30.0)
    p.add_argument("--in-process", action="store_true", help="replicas as threads (tests)")
    p.add_argument("--log-level", default="info")
    p.add_argument(
        "--profile-out",
        default=None,
        help="each replica writes the steps it served (a live step profile for "
        "'deepinfer-sched calibrate') to this path + '-replica-<i>' on shutdown",
    )
    add_ray_arguments(p)
    return p


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    pd = None
    replicas = args.replicas
    if args.pd is not None:
        try:
            p, d = (int(x) for x in args.pd.split(":"))
        except ValueError:
            raise SystemExit(f"--pd: expected P:D (e.g. 1:2), got {args.pd!r}") from None
        pd, replicas = (p, d), p + d
    model = args.model or args.model_opt
    cache = None
    if not args.no_prefix_cache:
        blocks = max(1, args.num_blocks // 8)
        cache = PrefixCacheConfig(
            device_blocks=blocks,
            directory=args.cache_dir,
            disk_format=args.cache_disk_format,
            key_hash=args.cache_key_hash,
        )
    return ServeConfig(
        model=model,
        served_model_name=args.served_model_name,
        replicas=replicas,
        pd=pd,
        router=args.router,
        in_process=args.in_process,
        dtype=args.dtype,
        device=args.device,
        engine=EngineConfig(
            block_size=args.block_size,
            num_blocks=args.num_blocks,
            max_num_seqs=args.max_num_seqs,
            max_model_len=args.max_model_len,
        ),
        prefix_cache=cache,
        speculative=_speculative(args),
        threads_per_replica=args.threads,
        ttft_slo_s=args.ttft_slo,
        max_waiting=args.max_waiting,
        drain_timeout_s=args.drain_timeout,
        ray=ray_options_from_args(args),
        profile_out=args.profile_out,
    )


def _speculative(args: argparse.Namespace) -> str | SpeculativeConfig | None:
    if args.num_speculative_tokens is None and not args.no_draft_gate:
        return args.speculative  # type: ignore[no-any-return]
    if args.speculative is None:
        raise SystemExit("--num-speculative-tokens / --no-draft-gate need --speculative")
    try:
        return SpeculativeConfig(
            args.speculative, args.num_speculative_tokens, draft_gate=not args.no_draft_gate
        )
    except ValueError as exc:
        raise SystemExit(f"--speculative: {exc}") from None


def run_server(config: ServeConfig, host: str, port: int, log_level: str = "info") -> int:
    """Serve until SIGTERM/SIGINT (draining first). Returns the exit status."""
    import uvicorn

    from deepinfer.serve.app import build_app
    from deepinfer.serve.service import ServeService

    service = ServeService(config)
    app = build_app(service)

    class DrainingServer(uvicorn.Server):
        drain_requested = False

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if self.drain_requested or sig not in (signal.SIGTERM, signal.SIGINT):
                super().handle_exit(sig, frame)
                return
            self.drain_requested = True

    server = DrainingServer(
        uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on")
    )

    async def watch() -> None:
        while not server.drain_requested and not server.should_exit:
            await asyncio.sleep(0.05)
        if server.drain_requested:
            await service.drain()
            await service.close()
            server.should_exit = True

    async def main() -> None:
        watcher = asyncio.ensure_future(watch())
        try:
            await server.serve()
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    asyncio.run(main())
    return 0 if server.started else 1


def cmd_serve(args: argparse.Namespace) -> int:
    """The ``deepinfer serve`` command."""
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise SystemExit(
            f"deepinfer serve needs the 'serve' extra ({exc.name} is missing): "
            "pip install 'deepinfer[serve]'"
        ) from exc
    return run_server(config_from_args(args), args.host, args.port, args.log_level)
