"""CPU benchmark: what the sampling API's logits processing costs per engine step.

Shapes: B = 32 requests, V = 49152 (SmolLM2's vocabulary), fp32 logits, each request with a
256-token prompt and 128 generated tokens of history. ``sample_next_tokens`` runs with plain
``SamplingParams`` (the baseline, measured in the same run) and with penalties, logit bias and
logprobs; ``apply_penalties`` is also timed against its per-token reference loop, and the two
ops the engine's logits code became (``gather_logprobs``, ``apply_logit_bias``) against the
per-row torch code they replaced, alternated in the same process. Run::

    .venv/bin/pytest benchmarks/bench_sampling_params.py -q -s

The last test prints each case's cost as a ratio to the plain step. One intra-op thread, as in
``bench_kernels_verify.py`` (a shared machine's load would otherwise dominate).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from deepinfer.engine.output_processor import OutputProcessor
from deepinfer.engine.outputs import RequestMetrics
from deepinfer.engine.sampler import sample_next_tokens
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.engine.sequence import Sequence
from deepinfer_kernels import apply_logit_bias, apply_penalties, gather_logprobs
from deepinfer_kernels.reference import apply_penalties_reference
from deepinfer_kernels.sampling import pad_token_ids

B, V, PROMPT, OUTPUT = 32, 49152, 256, 128
_TIMES: dict[str, Any] = {}

CASES = {
    "plain": SamplingParams(temperature=0.8, top_p=0.95, max_tokens=1000),
    "penalties": SamplingParams(
        temperature=0.8,
        top_p=0.95,
        max_tokens=1000,
        repetition_penalty=1.1,
        presence_penalty=0.5,
        frequency_penalty=0.5,
    ),
    "logit_bias": SamplingParams(
        temperature=0.8, top_p=0.95, max_tokens=1000, logit_bias={i: 1.0 for i in range(100)}
    ),
    "logprobs5": SamplingParams(temperature=0.8, top_p=0.95, max_tokens=1000, logprobs=5),
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():  # type: ignore[no-untyped-def]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _seqs(params: SamplingParams) -> list[Sequence]:
    g = torch.Generator().manual_seed(0)
    proc = OutputProcessor(None, max_model_len=100_000)
    seqs = []
    for i in range(B):
        prompt = torch.randint(0, V, (PROMPT,), generator=g).tolist()
        seq = Sequence(i, str(i), prompt, params, b"", RequestMetrics(0.0))
        proc.track(seq)
        proc.append(seq, torch.randint(0, V, (OUTPUT,), generator=g).tolist())
        seqs.append(seq)
    return seqs


@pytest.mark.parametrize("case", list(CASES))
def test_sample_step(benchmark, case: str) -> None:  # type: ignore[no-untyped-def]
    seqs = _seqs(CASES[case])
    logits = torch.randn(B, V, generator=torch.Generator().manual_seed(1))
    gen = torch.Generator().manual_seed(2)
    benchmark(sample_next_tokens, seqs, logits, gen)
    _TIMES[case] = benchmark.stats.stats.median


def test_apply_penalties_vs_reference(benchmark) -> None:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(B, V, generator=g)
    prompt = pad_token_ids(torch.randint(0, V, (B, PROMPT), generator=g).tolist())
    output = pad_token_ids(torch.randint(0, V, (B, OUTPUT), generator=g).tolist())
    rows = (torch.full((B,), 0.5), torch.full((B,), 0.5), torch.full((B,), 1.1))
    benchmark(apply_penalties, logits, prompt, output, *rows)
    _TIMES["apply_penalties"] = benchmark.stats.stats.median
    start = time.perf_counter()
    want = apply_penalties_reference(logits, prompt, output, *rows)
    _TIMES["apply_penalties_reference"] = time.perf_counter() - start
    torch.testing.assert_close(apply_penalties(logits, prompt, output, *rows), want)


def _alternated(op, baseline, repeats: int = 15) -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
    """Min, median and max of op / baseline time ratios over ``repeats`` alternated pairs (same
    process; a loaded machine throws single pairs far off, so the median is the figure)."""
    op(), baseline()  # warm-up: first calls pay allocations and lazy initialisation
    ratios = []
    for _ in range(repeats):
        start = time.perf_counter()
        op()
        mid = time.perf_counter()
        baseline()
        ratios.append((mid - start) / (time.perf_counter() - mid))
    ratios.sort()
    return ratios[0], ratios[len(ratios) // 2], ratios[-1]


def _sorted_rows(lp: torch.Tensor, ids: list[int], top: int) -> None:
    """What the engine did per emitted token before ``gather_logprobs``: a full stable sort."""
    for row, token in zip(lp, ids):
        float(row[token])
        int((row > row[token]).sum())
        values, order = torch.sort(row, descending=True, stable=True)
        values[:top].tolist(), order[:top].tolist()


def test_gather_logprobs_vs_row_sort() -> None:
    lp = torch.log_softmax(torch.randn(B, V, generator=torch.Generator().manual_seed(4)), dim=-1)
    ids = torch.randint(0, V, (B,), generator=torch.Generator().manual_seed(5))
    got = gather_logprobs(lp, ids, 5)
    assert got[2][:, 0].tolist() == lp.argmax(dim=-1).tolist()
    _TIMES["gather_logprobs"] = _alternated(
        lambda: gather_logprobs(lp, ids, 5), lambda: _sorted_rows(lp, ids.tolist(), 5)
    )


def test_apply_logit_bias_vs_index_add() -> None:
    logits = torch.randn(B, V, generator=torch.Generator().manual_seed(6))
    bias = {i * 7: 1.0 for i in range(100)}
    ids = torch.tensor([list(bias)] * B)
    amounts = torch.ones(B, len(bias))

    def per_row() -> torch.Tensor:  # the engine's loop before apply_logit_bias
        out = logits.clone()
        for i in range(B):
            out[i].index_add_(0, torch.tensor(list(bias)), torch.tensor(list(bias.values())))
        return out

    torch.testing.assert_close(apply_logit_bias(logits, ids, amounts), per_row())
    _TIMES["apply_logit_bias"] = _alternated(
        lambda: apply_logit_bias(logits, ids, amounts), per_row
    )


def test_report() -> None:
    for name, baseline in (("gather_logprobs", "row sort"), ("apply_logit_bias", "index_add")):
        if name in _TIMES:
            low, mid, high = _TIMES[name]
            print(
                f"\n{name}: median {mid:.2f}x (range {low:.2f}-{high:.2f}) the per-row {baseline} "
                "it replaced, 15 alternated pairs"
            )
    if "plain" not in _TIMES:
        pytest.skip("the benchmarks did not run (--benchmark-disable?)")
    base = _TIMES["plain"]
    for case in CASES:
        print(
            f"\n{case:>12}: {_TIMES[case] * 1e3:7.2f} ms/step  ({_TIMES[case] / base:.2f}x plain)"
        )
    ref, ours = _TIMES["apply_penalties_reference"], _TIMES["apply_penalties"]
    print(
        f"apply_penalties {ours * 1e3:.2f} ms vs reference loop {ref * 1e3:.0f} ms ({ref / ours:.0f}x)"
    )
