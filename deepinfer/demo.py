"""The main job: an agent-style workload on the embedded model, with a report.

Several coding-agent conversations run side by side. Each shares one long system prompt, and
each turn appends a tool output (a slice of a real Python standard-library file) to a growing
history, so later turns re-read everything before them: the workload that a prefix cache is
for. After the conversations, the engine is closed and reopened and one conversation is resumed,
showing that the disk tier survives a restart.
"""

from __future__ import annotations

import json
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepinfer.engine.outputs import RequestOutput
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.llm import LLM

SYSTEM_PROMPT = (
    "You are a careful coding agent working inside a Python repository. You can call tools: "
    "read_file(path) returns a file's text, search(pattern) lists matching lines, and "
    "run_tests() runs the suite. Before you change anything, read the relevant code, explain "
    "what it does in plain words, and name the smallest change that fixes the problem. Prefer "
    "the standard library, keep functions short, write a test for every behaviour you change, "
    "and never guess at an API you have not read. When a tool output is long, summarise the "
    "part that matters for the user's question first. Answer concisely. "
) * 3

MODULES = ("json/decoder.py", "textwrap.py", "heapq.py", "fractions.py", "shlex.py", "bisect.py")

QUESTIONS = (
    "Read {name} and tell me what its main entry point does.",
    "Here is more of the file. Which function would you change to add a strict mode?",
    "Summarise the plan in two sentences.",
)


@dataclass(frozen=True)
class DemoConfig:
    """Size of the workload and where the report goes."""

    out_dir: str = "out/demo"
    num_conversations: int = 4
    num_turns: int = 3
    max_tokens: int = 32
    tool_output_lines: int = 30

    def __post_init__(self) -> None:
        if not 1 <= self.num_conversations <= len(MODULES):
            raise ValueError(f"num_conversations must be in [1, {len(MODULES)}]")
        if not 1 <= self.num_turns <= len(QUESTIONS):
            raise ValueError(f"num_turns must be in [1, {len(QUESTIONS)}]")
        if self.max_tokens < 1 or self.tool_output_lines < 1:
            raise ValueError("max_tokens and tool_output_lines must be >= 1")


@dataclass
class TurnRecord:
    conversation: int
    turn: int
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    output_tokens: int
    spec_steps: int
    verified_drafts: int
    accepted_drafts: int


@dataclass
class DemoResult:
    turns: list[TurnRecord] = field(default_factory=list)
    elapsed_s: float = 0.0
    output_tokens: int = 0
    tier_hits: dict[str, int] = field(default_factory=dict)
    hit_rate: float = 0.0
    restart_cached_tokens: int = 0
    restart_prompt_tokens: int = 0
    restart_ttft_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        ttfts = sorted(t.ttft_s for t in self.turns)
        steps = sum(t.spec_steps for t in self.turns)
        verified = sum(t.verified_drafts for t in self.turns)
        accepted = sum(t.accepted_drafts for t in self.turns)
        return {
            "output_tokens_per_s": self.output_tokens / self.elapsed_s if self.elapsed_s else 0.0,
            "ttft_p50_s": ttfts[len(ttfts) // 2] if ttfts else None,
            "ttft_first_turn_mean_s": _mean([t.ttft_s for t in self.turns if t.turn == 0]),
            "ttft_later_turns_mean_s": _mean([t.ttft_s for t in self.turns if t.turn > 0]),
            "prefix_hit_rate": self.hit_rate,
            "hit_tokens_per_tier": self.tier_hits,
            "spec_accepted_length": (accepted + steps) / steps if steps else None,
            "spec_verified_per_step": verified / steps if steps else None,
            "restart_hit_fraction": (
                self.restart_cached_tokens / self.restart_prompt_tokens
                if self.restart_prompt_tokens
                else 0.0
            ),
        }


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _tool_output(module: str, turn: int, lines: int) -> str:
    path = Path(sysconfig.get_paths()["stdlib"]) / module
    text = path.read_text(encoding="utf-8").splitlines()
    start = turn * lines
    body = "\n".join(text[start : start + lines])
    return f"<tool name=read_file path={module}>\n{body}\n</tool>"


def _run_round(
    llm: LLM, prompts: list[list[int]], params: SamplingParams, bar: Any
) -> list[RequestOutput]:
    engine = llm.engine
    ids = [
        engine.add_request(
            p, params, request_id=f"r{time.perf_counter_ns()}-{i}", namespace=b"demo"
        )
        for i, p in enumerate(prompts)
    ]
    done: dict[str, RequestOutput] = {}
    while engine.has_unfinished():
        for out in engine.step():
            bar.update(len(out.new_token_ids))
            if out.finished:
                done[out.request_id] = out
    return [done[i] for i in ids]


def _record(conv: int, turn: int, out: RequestOutput) -> TurnRecord:
    m = out.metrics
    assert m is not None
    return TurnRecord(
        conversation=conv,
        turn=turn,
        prompt_tokens=m.num_prompt_tokens,
        cached_tokens=m.num_cached_tokens,
        ttft_s=m.ttft or 0.0,
        output_tokens=len(out.token_ids),
        spec_steps=m.num_spec_steps,
        verified_drafts=m.num_verified_drafts,
        accepted_drafts=m.num_accepted_drafts,
    )


def run_demo(config: DemoConfig, make_llm: Callable[[], LLM]) -> DemoResult:
    """Run the workload, print the figures and write ``report.md`` + plots to ``out_dir``."""
    from tqdm import tqdm

    result = DemoResult()
    params = SamplingParams(temperature=0.0, max_tokens=config.max_tokens)
    histories = [
        [{"role": "system", "content": SYSTEM_PROMPT}] for _ in range(config.num_conversations)
    ]
    total = config.num_conversations * config.num_turns * config.max_tokens
    with make_llm() as llm:
        start = time.perf_counter()
        with tqdm(total=total, desc="demo", unit="tok") as bar:
            for turn in range(config.num_turns):
                prompts = []
                for c, history in enumerate(histories):
                    module = MODULES[c]
                    question = QUESTIONS[turn].format(name=module)
                    content = f"{question}\n{_tool_output(module, turn, config.tool_output_lines)}"
                    history.append({"role": "user", "content": content})
                    text = llm.loaded.chat_template.render(history, add_generation_prompt=True)
                    prompts.append(llm.tokenizer.encode(text, add_bos=False))
                for c, out in enumerate(_run_round(llm, prompts, params, bar)):
                    histories[c].append({"role": "assistant", "content": out.text})
                    result.turns.append(_record(c, turn, out))
                    result.output_tokens += len(out.token_ids)
        result.elapsed_s = time.perf_counter() - start
        if llm.store is not None:
            stats = llm.store.stats()
            result.hit_rate = stats.hit_rate
            result.tier_hits = {t.name: t.hit_tokens for t in stats.tiers}
    # A fresh engine on the same cache directory: the conversation resumes from the disk tier.
    with make_llm() as llm:
        text = llm.loaded.chat_template.render(histories[0], add_generation_prompt=True)
        ids = llm.tokenizer.encode(text, add_bos=False)
        out = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=1), namespace=b"demo")[
            0
        ]
        assert out.metrics is not None
        result.restart_prompt_tokens = out.metrics.num_prompt_tokens
        result.restart_cached_tokens = out.metrics.num_cached_tokens
        result.restart_ttft_s = out.metrics.ttft or 0.0
    _report(config, result)
    return result


def _report(config: DemoConfig, result: DemoResult) -> None:
    out_dir = Path(config.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = result.summary()
    print(json.dumps(summary, indent=2))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    lines = [
        "# deepinfer demo report",
        "",
        f"{config.num_conversations} agent conversations x {config.num_turns} turns on the "
        "embedded SmolLM2-135M-Instruct, greedy, "
        f"{config.max_tokens} new tokens per turn.",
        "",
        "| figure | value |",
        "|---|---|",
    ]
    for key, value in summary.items():
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        lines.append(f"| {key} | {shown} |")
    lines += [
        "",
        "| conversation | turn | prompt tokens | cached tokens | TTFT (s) | output tokens |",
        "|---|---|---|---|---|---|",
    ]
    for t in result.turns:
        lines.append(
            f"| {t.conversation} | {t.turn} | {t.prompt_tokens} | {t.cached_tokens} | "
            f"{t.ttft_s:.3f} | {t.output_tokens} |"
        )
    lines += ["", "![TTFT per turn](ttft.png)", ""]
    (out_dir / "report.md").write_text("\n".join(lines))
    _plot(result, out_dir / "ttft.png")
    print(f"report written to {out_dir / 'report.md'}")


def _plot(result: DemoResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for conv in sorted({t.conversation for t in result.turns}):
        turns = [t for t in result.turns if t.conversation == conv]
        ax1.plot(
            [t.turn for t in turns], [t.ttft_s for t in turns], marker="o", label=f"conv {conv}"
        )
        ax2.plot(
            [t.turn for t in turns],
            [t.cached_tokens / max(t.prompt_tokens, 1) for t in turns],
            marker="o",
        )
    ax1.set(xlabel="turn", ylabel="TTFT (s)", title="Time to first token")
    ax1.legend()
    ax2.set(
        xlabel="turn", ylabel="cached fraction of prompt", title="Prefix cache hits", ylim=(0, 1)
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
