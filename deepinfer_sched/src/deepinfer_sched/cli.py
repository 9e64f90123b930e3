"""``deepinfer-sched`` command line: run a simulation, write a JSON report and plots.

Example::

    deepinfer-sched simulate --config cfg.json --trace synthetic --requests 5000 \\
        --rate 4 --out runs/a
    deepinfer-sched simulate --config cfg.json --trace mooncake.jsonl --out runs/b
    deepinfer-sched calibrate --profile profile.json --out costmodel.json
    deepinfer-sched calibrate --profile live-replica-0.json live-replica-1.json --out cm.json
    deepinfer-sched simulate --cost-model costmodel.json --trace t.jsonl --out runs/c

``--config`` is a JSON :class:`~deepinfer_sched.sim.SimConfig` (nested ``scheduler``);
without it the defaults run. tqdm and matplotlib are imported lazily (``[cli]`` extra).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, NoReturn

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    """A usage error is one line (``deepinfer-sched simulate: error: ...``), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _version() -> str:
    try:
        return metadata.version("deepinfer-sched")
    except metadata.PackageNotFoundError:
        return "unknown"


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="deepinfer-sched", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    s = sub.add_parser("simulate", help="simulate a trace on a cluster configuration")
    s.add_argument("--config", type=Path, help="SimConfig JSON file (defaults if omitted)")
    s.add_argument(
        "--trace",
        required=True,
        help="trace file (Mooncake JSONL, Azure/BurstGPT CSV) or 'synthetic'",
    )
    s.add_argument("--format", default="auto", help="trace format (auto|mooncake|azure|burstgpt)")
    s.add_argument("--block-size", type=int, default=512, help="tokens per block (file traces)")
    s.add_argument("--limit", type=int, default=None, help="read at most this many requests")
    s.add_argument(
        "--rechain",
        action="store_true",
        help="Mooncake: hash_ids are per-block content ids; chain them on load",
    )
    s.add_argument("--requests", type=int, default=10_000, help="synthetic: number of requests")
    s.add_argument("--rate", type=float, default=10.0, help="synthetic: requests per second")
    s.add_argument("--seed", type=int, default=0, help="trace and simulation seed")
    s.add_argument("--out", type=Path, required=True, help="output directory")
    s.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    s.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    s.add_argument(
        "--cost-model",
        type=Path,
        default=None,
        help="fitted cost model JSON from 'calibrate' (default: the roofline of the config)",
    )
    c = sub.add_parser("calibrate", help="fit a cost model to an engine's step profile")
    c.add_argument(
        "--profile",
        type=Path,
        nargs="+",
        required=True,
        help="step profile JSON: 'deepinfer bench --profile', or the live profiles of "
        "'deepinfer serve --profile-out' (several files: their steps are fitted together)",
    )
    c.add_argument("--out", type=Path, required=True, help="fitted cost model JSON to write")
    c.add_argument("--link-gbps", type=float, default=200.0, help="KV link, Gbit/s")
    c.add_argument("--link-latency-us", type=float, default=20.0, help="KV link latency, us")
    c.add_argument("--ssd-gbps", type=float, default=40.0, help="SSD tier read, Gbit/s")
    c.add_argument("--ssd-latency-us", type=float, default=100.0, help="SSD read latency, us")
    return p


def _load_config(path: Path | None) -> Any:
    from deepinfer_sched.sim import SimConfig

    if path is None:
        return SimConfig()
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--config {path}: cannot read JSON ({e})") from e
    if not isinstance(data, dict):
        raise ValueError(f"--config {path}: expected a JSON object")
    return SimConfig.from_dict(data)


def _simulate(args: argparse.Namespace) -> int:
    from deepinfer_sched.report import SLO
    from deepinfer_sched.sim import Simulator
    from deepinfer_sched.traces import SyntheticTraceConfig, load_trace, synthetic_trace

    cfg = _load_config(args.config)
    if args.trace == "synthetic":
        trace = synthetic_trace(
            SyntheticTraceConfig(num_requests=args.requests, request_rate=args.rate, seed=args.seed)
        )
    else:
        trace = load_trace(
            args.trace,
            format=args.format,
            block_size=args.block_size,
            limit=args.limit,
            rechain=args.rechain,
        )
    cm = None
    if args.cost_model is not None:
        from deepinfer_sched.costmodel import FittedCostModel

        try:
            cm = FittedCostModel.from_json(args.cost_model.read_text())
        except (OSError, ValueError, TypeError) as e:
            raise ValueError(f"--cost-model {args.cost_model}: {e}") from None
    sim = Simulator(trace, cfg, args.seed, cm)
    tqdm = None if args.no_progress else _optional("tqdm", "the progress bar")
    if tqdm is None:
        res = sim.run()
    else:
        with tqdm.tqdm(total=len(trace), unit="req", desc="simulating") as bar:
            res = sim.run(bar.update)
    slo = SLO(cfg.ttft_slo_s, cfg.tpot_slo_s)
    report = res.report(slo, cfg.hit_price, cfg.miss_price)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "config": cfg.to_dict(),
        "trace": {"name": trace.name, "num_requests": len(trace), "seed": args.seed},
        "simulator": res.stats(),
        "report": report.to_dict(),
    }
    (out / "report.json").write_text(json.dumps(doc, indent=2, sort_keys=True, allow_nan=False))
    if not args.no_plots and _optional("matplotlib", "the PNG plots") is not None:
        from deepinfer_sched.report.plots import plot_latency_cdf

        for metric in ("ttft", "tpot", "e2e"):
            plot_latency_cdf({"simulated": res.records}, out / f"{metric}_cdf.png", metric, slo)
    print(
        f"{len(trace)} requests: goodput {report.goodput_rps:.3f} req/s, "
        f"SLO attainment {report.slo_attainment:.3f}, hit rate {report.hit_rate:.3f}, "
        f"rejected {report.num_rejected} -> {out / 'report.json'}"
    )
    return 0


def _optional(module: str, purpose: str) -> Any:
    """``module`` from the ``[cli]`` extra, or None (with a note on stderr) when it is not
    installed: the simulation and its JSON report never need it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        print(
            f"deepinfer-sched: {module} is not installed, skipping {purpose} "
            "(pip install 'deepinfer-sched[cli]')",
            file=sys.stderr,
        )
        return None


def _calibrate(args: argparse.Namespace) -> int:
    from deepinfer_sched.costmodel import fit_profile, load_profile, merge_profiles

    for name in ("link_gbps", "ssd_gbps"):
        if not getattr(args, name) > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0")
    profiles = [load_profile(p) for p in args.profile]
    if len(profiles) == 1:
        profile = profiles[0]
    elif all("steps" in p for p in profiles):
        profile = merge_profiles(profiles)
    else:
        raise ValueError("--profile: several files must all be live profiles (with 'steps')")
    cm = fit_profile(
        profile,
        link_bandwidth=args.link_gbps * 1e9 / 8,
        link_latency_s=args.link_latency_us * 1e-6,
        ssd_bandwidth=args.ssd_gbps * 1e9 / 8,
        ssd_latency_s=args.ssd_latency_us * 1e-6,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(cm.to_json())
    p0, p1, p2 = cm.prefill_coef
    d0, d1, d2 = cm.decode_coef
    if "steps" in profile:
        e = cm.fit_error
        print(
            f"step = {d0 * 1e3:.3f} ms + sum over prefill chunks ({(p0 - d0) * 1e3:.3f} ms + "
            f"{p1 * 1e6:.3f} us n + {p2 * 1e9:.4f} ns n (c + n/2) + "
            f"{cm.cached_coef * 1e6:.3f} us c) + {d1 * 1e6:.3f} us B + {d2 * 1e9:.4f} ns T\n"
            f"{int(e['steps'])} live steps: relative RMS error per step "
            f"{e['steps_rel_rms']:.3f}, of the summed time {e['steps_total_rel']:.4f} -> {args.out}"
        )
        return 0
    print(
        f"prefill(n, c) = {p0 * 1e3:.3f} ms + {p1 * 1e6:.3f} us n + {p2 * 1e9:.4f} ns n (c + n/2)"
        f" [max rel err {cm.fit_error['prefill_max_rel']:.3f}]\n"
        f"decode(B, T) = {d0 * 1e3:.3f} ms + {d1 * 1e6:.3f} us B + {d2 * 1e9:.4f} ns T"
        f" [max rel err {cm.fit_error['decode_max_rel']:.3f}] -> {args.out}"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``deepinfer-sched``: 0 ok, 1 failed (I/O), 2 bad arguments or input.
    Errors are one line on stderr."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "calibrate":
            return _calibrate(args)
        return _simulate(args)
    except (ValueError, TypeError) as e:
        print(f"deepinfer-sched: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"deepinfer-sched: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("deepinfer-sched: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
