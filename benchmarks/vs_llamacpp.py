"""DeepInfer vs llama.cpp (``llama-cpp-python``) on the same GGUF file, same threads, same run.

Both engines load the same file (default: the embedded SmolLM2-135M-Instruct Q4_1); DeepInfer
runs it on its block-format weights (``deepinfer.models.gguf_model``), llama.cpp on its own
kernels. Each measurement alternates the two engines ``--repeats`` times and reports the
median ratio and the range:

1. batch-1 greedy decode: tokens/s over ``--tokens`` new tokens after a code-editing prompt
   (decode time only: timed from the first streamed token to the last); a second row times the
   lean runtime's decode the same way against its own llama.cpp run;
2. prefill of a ``--prefill`` (2048) token prompt: prompt tokens/s; a second row times the
   lean runtime (``deepinfer.lean``, ``deepinfer generate``'s default for a GGUF on the CPU) on
   the same prompt in this process against its own llama.cpp run;
3. 16 concurrent requests: total generated tokens/s. DeepInfer batches them continuously;
   llama.cpp's Python binding runs one sequence per context, so its figure is the 16 requests
   one after another (the table says so; llama.cpp's server with parallel slots would batch);
4. peak RSS of each engine, each in a fresh child process (``VmHWM``), at the same context
   length: DeepInfer is ``deepinfer generate`` itself (the CLI, 32 tokens), with its default
   runtime (lean for a GGUF on the CPU: no torch in the process) and with ``--runtime engine``
   (``engine_memory.py`` breaks the engine's down phase by phase). ``--rss-only`` also times the
   lean runtime's batch-1 decode against the engine's in this process, alternated.

Issue #24's targets: decode >= 1.0x, 2k prefill >= 2x, 16 concurrent >= 3x llama.cpp; RSS of
``deepinfer generate`` <= 1.5x llama.cpp's.

llama-cpp-python is a benchmark-only dependency (``make bench`` installs it; building it from
source with native CPU flags takes tens of minutes). Without it the script says so and exits 2.

    .venv/bin/python benchmarks/vs_llamacpp.py --threads 2 --out benchmarks/results/vs_llamacpp.md

On a loaded machine, ``--threads 1 --cpu-time --parts decode,batch --no-rss`` compares the decode
and the 16-concurrent throughput per CPU second of each engine's process instead of per wall
second.

``--out`` writes the markdown table there, the figures beside it as JSON and a PNG chart.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

CODE_PROMPT = (
    "Rename the function `compute_total` to `sum_prices` and update every call.\n\n"
    "```python\ndef compute_total(items):\n    total = 0\n    for item in items:\n"
    "        total += item.price * item.quantity\n    return total\n```\n\n"
    "Here is the updated code:\n\n```python\n"
)


def _median_range(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def _streamed_rate(outputs: Iterable[Any], new: int, clock: Callable[[], float]) -> float:
    """Tokens/s of a stream of outputs (each with the ``token_ids`` so far) from its first token
    to its last: the prefill, before the first output, is not in the time."""
    first, count = None, 0
    for out in outputs:
        first = clock() if first is None else first
        count = len(out.token_ids)
    assert first is not None and count == new, count
    return (count - 1) / (clock() - first)


class Ours:
    """DeepInfer on the GGUF file, greedy, EOS ignored."""

    def __init__(self, path: Path, threads: int, ctx: int) -> None:
        import torch

        from deepinfer import LLM, EngineConfig

        torch.set_num_threads(threads)
        self.llm = LLM(
            str(path),
            engine_config=EngineConfig(max_model_len=ctx, num_blocks=-(-ctx // 16) * 17),
            enable_prefix_caching=False,
        )

    def tokens(self, text: str) -> list[int]:
        return self.llm.encode(text)

    def generate(
        self, prompts: list[list[int]], new: int, clock: Callable[[], float] = time.perf_counter
    ) -> float:
        from deepinfer import SamplingParams

        params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
        start = clock()
        self.llm.generate(prompts, params)
        return clock() - start

    def decode_rate(
        self, prompt: list[int], new: int, clock: Callable[[], float] = time.perf_counter
    ) -> float:
        """Tokens/s after the first token (streamed: the prefill is not in the time)."""
        from deepinfer import SamplingParams

        params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
        return _streamed_rate(self.llm.stream(prompt, params), new, clock)


class Theirs:
    """llama.cpp through llama-cpp-python on the same file, greedy."""

    def __init__(self, path: Path, threads: int, ctx: int) -> None:
        from llama_cpp import Llama

        self.llm = Llama(
            model_path=str(path), n_ctx=ctx, n_threads=threads, n_threads_batch=threads,
            n_batch=512, verbose=False, logits_all=False,
        )  # fmt: skip

    def tokens(self, text: str) -> list[int]:
        return list(self.llm.tokenize(text.encode(), add_bos=False))

    def generate(
        self, prompts: list[list[int]], new: int, clock: Callable[[], float] = time.perf_counter
    ) -> float:
        start = clock()
        for prompt in prompts:  # one sequence per context in the Python binding
            self.llm.reset()
            for produced, _ in enumerate(
                self.llm.generate(prompt, temp=0.0, top_k=1, reset=True), start=1
            ):
                if produced >= new:
                    break
        return clock() - start

    def decode_rate(
        self, prompt: list[int], new: int, clock: Callable[[], float] = time.perf_counter
    ) -> float:
        """Tokens/s after the first token (the prefill is not in the time)."""
        self.llm.reset()
        first = None
        for produced, _ in enumerate(
            self.llm.generate(prompt, temp=0.0, top_k=1, reset=True), start=1
        ):
            first = clock() if first is None else first
            if produced >= new:
                break
        assert first is not None
        return (new - 1) / (clock() - first)


def _decode_rate(
    engine: Ours | Theirs, prompt: list[int], new: int, clock: Callable[[], float]
) -> float:
    """Decode tokens/s from the first token to the last, streamed. (The difference of a
    ``new``-token and a one-token run, used before, swung past zero on a loaded machine.)"""
    return engine.decode_rate(prompt, new, clock)


def _prefill_rate(engine: Ours | Theirs | Lean, prompt: list[int]) -> float:
    return len(prompt) / engine.generate([prompt], 1)


def _batch_rate(
    engine: Ours | Theirs, prompts: list[list[int]], new: int, clock: Callable[[], float]
) -> float:
    return len(prompts) * new / engine.generate(prompts, new, clock)


def _cli_peak_rss(runtime: str, path: Path, threads: int, ctx: int, tokens: int) -> float:
    """Peak RSS (GB) of ``deepinfer generate`` (``runtime``: ``auto``, the default, or
    ``engine``) generating exactly ``tokens`` greedy tokens of the code prompt, in a fresh
    process: its own ``--stats`` line reports ``VmHWM``. The ``auto`` run must have chosen the
    lean runtime, without torch, or the figure would not be the one it claims."""
    cmd = [sys.executable, "-m", "deepinfer.cli", "generate", CODE_PROMPT, "--model", str(path),
           "--max-tokens", str(tokens), "--min-tokens", str(tokens), "--temperature", "0",
           "--max-model-len", str(ctx), "--no-prefix-cache", "--threads", str(threads),
           "--runtime", runtime, "--stats"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    stats = json.loads([x for x in out.stderr.splitlines() if x.startswith('{"runtime"')][-1])
    if runtime == "auto" and (stats["runtime"] != "lean" or stats["torch_imported"]):
        raise RuntimeError(f"deepinfer generate did not run lean without torch: {stats}")
    return float(stats["peak_rss_mb"]) / 1024


class Lean:
    """DeepInfer's lean runtime (``deepinfer.lean``) on the file, greedy, EOS ignored (here in
    this process, beside torch: for its decode speed, not its memory)."""

    def __init__(self, path: Path, threads: int, ctx: int) -> None:
        from deepinfer.lean import LeanLLM

        self.llm = LeanLLM(str(path), max_model_len=ctx, threads=threads)

    def tokens(self, text: str) -> list[int]:
        return self.llm.encode(text)

    def generate(
        self, prompts: list[list[int]], new: int, clock: Callable[[], float] = time.perf_counter
    ) -> float:
        """Seconds to prefill each prompt (token ids) and decode ``new - 1`` greedy tokens
        after it, one sequence after another (the lean runtime runs one sequence)."""
        import numpy as np

        model = self.llm.model
        assert model is not None
        start = clock()
        for ids in prompts:
            model.reset()
            logits = model.prefill(ids)
            for _ in range(new - 1):
                logits = model.decode(int(np.argmax(logits)))
        return clock() - start

    def decode_rate(
        self, prompt: str, new: int, clock: Callable[[], float] = time.perf_counter
    ) -> float:
        """Tokens/s after the first token (the prefill is not in the time)."""
        from deepinfer.lean import LeanSampling

        params = LeanSampling(temperature=0, max_tokens=new, ignore_eos=True)
        return _streamed_rate(self.llm.stream(prompt, params), new, clock)


def _lean_decode(
    path: Path, threads: int, ctx: int, new: int, repeats: int,
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:  # fmt: skip
    """Lean / engine batch-1 decode speed ratios, alternated in this process (``clock``:
    ``time.process_time`` for tokens per CPU second at one thread)."""
    engine, lean = Ours(path, threads, ctx), Lean(path, threads, ctx)
    prompt = CODE_PROMPT
    ratios = []
    for repeat in range(repeats):
        a = lean.decode_rate(prompt, new, clock)
        b = engine.decode_rate(engine.tokens(prompt), new, clock)
        ratios.append(a / b)
        unit = "tok/CPU-s" if clock is time.process_time else "tok/s"
        print(f"run {repeat + 1} decode: lean {a:.1f}, engine {b:.1f} {unit}, {a / b:.2f}x",
              flush=True)  # fmt: skip
    return ratios


def _peak_rss(kind: str, path: Path, threads: int, ctx: int, tokens: int) -> float:
    """Peak RSS (GB) of a fresh process that loads ``kind`` and generates ``tokens`` tokens
    (``ours``: ``deepinfer generate`` with its default runtime; ``engine``: with
    ``--runtime engine``; ``theirs``: llama.cpp).

    Read from ``VmHWM`` (the peak of this process image): on Linux ``ru_maxrss`` survives
    ``exec``, so a child forked from this process (both engines loaded) would report at least
    this process's RSS, whatever it ran."""
    if kind in ("ours", "engine"):
        return _cli_peak_rss("auto" if kind == "ours" else "engine", path, threads, ctx, tokens)
    here = str(Path(__file__).parent)
    code = (
        f"import resource, sys; sys.path.insert(0, {here!r})\n"
        "def peak():\n"
        "    try:\n"
        "        with open('/proc/self/status') as fh:\n"
        "            return next(int(l.split()[1]) / 2**20 for l in fh if l.startswith('VmHWM'))\n"
        "    except (OSError, StopIteration):\n"
        "        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20\n"
        "from vs_llamacpp import Ours, Theirs, CODE_PROMPT\n"
        f"e = (Ours if {kind!r} == 'ours' else Theirs)"
        f"(__import__('pathlib').Path({str(path)!r}), {threads}, {ctx})\n"
        f"e.generate([e.tokens(CODE_PROMPT)], {tokens})\n"
        "print(peak())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file (default: the embedded one)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prefill", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="write the markdown table here")
    parser.add_argument("--rss-only", action="store_true", help="measure peak RSS only")
    parser.add_argument(
        "--parts",
        default="decode,prefill,batch",
        help="comma-separated measurements to run (decode, prefill, batch)",
    )
    parser.add_argument("--no-rss", action="store_true", help="skip the peak RSS measurement")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="decode and batch: tokens per CPU second of this process (time.process_time), not "
        "wall time; needs --threads 1 (each engine then computes on one thread, and other "
        "processes on a loaded machine barely move the figure)",
    )
    args = parser.parse_args()
    if args.cpu_time and args.threads != 1:
        parser.error("--cpu-time: needs --threads 1 (spinning worker threads would count)")
    clock = time.process_time if args.cpu_time else time.perf_counter
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("llama-cpp-python is not installed (make bench installs it); not measured")
        return 2
    from deepinfer.models import default_model_path

    path = Path(args.model) if args.model else default_model_path()
    ctx = args.prefill + args.tokens + 64
    if args.rss_only:
        gb = {k: _peak_rss(k, path, args.threads, ctx, 32) for k in ("ours", "engine", "theirs")}
        print(f"peak RSS (deepinfer generate, 32 tokens, ctx {ctx}): lean (default) "
              f"{gb['ours']:.3f} GB, engine {gb['engine']:.3f} GB, llama.cpp "
              f"{gb['theirs']:.3f} GB; lean {gb['ours'] / gb['theirs']:.2f}x, engine "
              f"{gb['engine'] / gb['theirs']:.2f}x llama.cpp")  # fmt: skip
        ratios = _lean_decode(path, args.threads, ctx, args.tokens, args.repeats, clock)
        print(f"batch-1 decode, lean / engine ({args.tokens} tokens, {args.threads} threads): "
              f"{_median_range(ratios)}")  # fmt: skip
        return 0
    ours, theirs = Ours(path, args.threads, ctx), Theirs(path, args.threads, ctx)
    code = ours.tokens(CODE_PROMPT)
    long_prompt = (ours.tokens(CODE_PROMPT * 200))[: args.prefill]
    batch = [ours.tokens(f"Question {i}: " + CODE_PROMPT) for i in range(args.batch)]
    rows: dict[str, list[float]] = {"decode": [], "prefill": [], "batch": []}
    figures: dict[str, list[tuple[float, float]]] = {k: [] for k in rows}
    runs: dict[str, Callable[[Ours | Theirs], float]] = {
        "decode": lambda e: _decode_rate(e, code, args.tokens, clock),
        "prefill": lambda e: _prefill_rate(e, long_prompt),
        "batch": lambda e: _batch_rate(e, batch, args.tokens // 4, clock),
    }
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(runs))
    if unknown:
        parser.error(f"--parts: unknown measurement(s) {', '.join(unknown)}; known: decode, "
                     "prefill, batch")  # fmt: skip
    runs = {name: run for name, run in runs.items() if name in parts}
    if "decode" in runs or "prefill" in runs:
        # Second decode and prefill rows: the lean runtime (the CLI's default for a GGUF on the
        # CPU) in this process, against their own llama.cpp runs, alternated; the engine's rows
        # unchanged.
        lean = Lean(path, args.threads, ctx)
        if "decode" in runs:
            # The lean runtime takes the prompt as text (the same ids as ``code``).
            runs["decode_lean"] = lambda e: (
                lean.decode_rate(CODE_PROMPT, args.tokens, clock)
                if e is ours
                else _decode_rate(e, code, args.tokens, clock)
            )
        if "prefill" in runs:
            runs["prefill_lean"] = lambda e: _prefill_rate(lean if e is ours else e,
                                                           long_prompt)  # fmt: skip
        for name in ("decode_lean", "prefill_lean"):
            if name in runs:
                rows[name], figures[name] = [], []
    rows = {name: rows[name] for name in runs}
    for repeat in range(args.repeats):
        for name, run in runs.items():
            a, b = run(ours), run(theirs)  # alternated, same process
            rows[name].append(a / b)
            figures[name].append((a, b))
            print(f"run {repeat + 1} {name}: DeepInfer {a:.1f}, llama.cpp {b:.1f}, "
                  f"{a / b:.2f}x", flush=True)  # fmt: skip
    rss_ours = rss_theirs = float("nan")
    if not args.no_rss:
        rss_ours = _peak_rss("ours", path, args.threads, ctx, 32)
        rss_theirs = _peak_rss("theirs", path, args.threads, ctx, 32)
    lines = [
        "## DeepInfer vs llama.cpp on the same GGUF (CPU)",
        "",
        f"`{path.name}`, {args.threads} threads, {args.repeats} alternated runs; ratios are "
        "DeepInfer / llama.cpp, median (range).",
        "",
        "| measurement | DeepInfer | llama.cpp | ratio | target |",
        "|---|---|---|---|---|",
    ]
    targets = {"decode": ">= 1.0x", "decode_lean": ">= 1.0x", "prefill": ">= 2x",
               "prefill_lean": ">= 2x", "batch": ">= 3x"}  # fmt: skip
    labels = {
        "decode": f"batch-1 greedy decode, tok/{'CPU-s' if args.cpu_time else 's'} "
        f"({args.tokens} tokens)",
        "decode_lean": f"lean batch-1 greedy decode, tok/{'CPU-s' if args.cpu_time else 's'} "
        f"({args.tokens} tokens; the lean runtime, `deepinfer generate`'s default)",
        "prefill": f"prefill, prompt tok/s ({len(long_prompt)} tokens)",
        "prefill_lean": f"lean prefill, prompt tok/s ({len(long_prompt)} tokens; the lean "
        "runtime, `deepinfer generate`'s default)",
        "batch": f"{args.batch} concurrent, total tok/{'CPU-s' if args.cpu_time else 's'} "
        "(llama.cpp: sequential)",
    }
    for name in rows:
        a = statistics.median(x for x, _ in figures[name])
        b = statistics.median(y for _, y in figures[name])
        lines.append(f"| {labels[name]} | {a:.1f} | {b:.1f} | {_median_range(rows[name])} "
                     f"| {targets[name]} |")  # fmt: skip
    if not args.no_rss:
        lines.append(
            f"| peak RSS, GB (`deepinfer generate`, default runtime, 32 tokens, ctx {ctx}) | "
            f"{rss_ours:.2f} | {rss_theirs:.2f} | "
            f"{rss_ours / rss_theirs:.2f}x | <= 1.5x |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
        record = {**figures, "rss_gb": [(rss_ours, rss_theirs)]}
        Path(args.out).with_suffix(".json").write_text(json.dumps(record, indent=2))
        _plot(record, labels, targets, Path(args.out).with_suffix(".png"))
    return 0


def _plot(
    record: dict[str, list[tuple[float, float]]],
    labels: dict[str, str],
    targets: dict[str, str],
    path: Path,
) -> None:
    """Each measurement's DeepInfer / llama.cpp ratio (median, with the run-to-run range as
    an error bar) beside its target, and the peak RSS of both; written as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = ("decode", "decode_lean", "prefill", "prefill_lean", "batch")
    names = [n for n in order if record.get(n)]
    ratios = [[a / b for a, b in record[n]] for n in names]
    mid = [statistics.median(r) for r in ratios]
    err = [[m - min(r) for m, r in zip(mid, ratios)], [max(r) - m for m, r in zip(mid, ratios)]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), width_ratios=[3, 1])
    xs = range(len(names))
    left.bar(xs, mid, yerr=err, capsize=4, color="tab:blue", label="DeepInfer / llama.cpp")
    for x, n in zip(xs, names):
        goal = float(targets[n].split()[-1].rstrip("x"))
        left.hlines(goal, x - 0.4, x + 0.4, colors="tab:red", linestyles="--",
                    label="target" if x == 0 else None)  # fmt: skip
    left.axhline(1.0, color="gray", linewidth=0.8)
    short = {"decode": "decode", "decode_lean": "lean decode", "prefill": "prefill",
             "prefill_lean": "lean prefill", "batch": "16 concurrent"}  # fmt: skip
    left.set_xticks(list(xs), [short.get(n, labels[n].split(",")[0]) for n in names])
    left.set_ylabel("throughput ratio (same run)")
    left.legend(loc="upper left")
    ours, theirs = record["rss_gb"][0]
    right.bar([0, 1], [ours, theirs], color=["tab:blue", "tab:orange"])
    right.hlines(1.5 * theirs, -0.4, 0.4, colors="tab:red", linestyles="--")
    right.set_xticks([0, 1], ["DeepInfer", "llama.cpp"])
    right.set_ylabel("peak RSS, GB")
    fig.suptitle("DeepInfer vs llama.cpp, same GGUF file, same threads (CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
