"""SpecDecoder end to end: lossless sampling, exact greedy, state consistency, errors."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from conftest import RaggedScheduler, make_drafter

from deepinfer_spec import (
    PrefixScheduler,
    RecomputeTarget,
    SpecDecoder,
    SPSCurve,
    VerifyScheduler,
)
from deepinfer_spec.testing import TinyTarget


def _chi_square_z(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Wilson-Hilferty z-score of Pearson's statistic; cells with expectation < 5 are pooled."""
    n = float(counts.sum())
    expected = probs * n
    small = expected < 5
    obs = torch.cat((counts[~small], counts[small].sum()[None]))
    exp = torch.cat((expected[~small], expected[small].sum()[None]))
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = float(((obs - exp) ** 2 / exp).sum())
    k = obs.numel() - 1
    return ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))


@torch.no_grad()
def _exact_two_token(model: TinyTarget, prompt: list[int], temperature: float) -> torch.Tensor:
    v = model.vocab_size
    first = torch.softmax(model.score(torch.tensor([prompt]), [0]).logits[0, -1] / temperature, -1)
    seqs = torch.tensor([[*prompt, x] for x in range(v)])
    second = torch.softmax(model.score(seqs, [0]).logits[:, -1] / temperature, -1)
    return (first[:, None] * second).reshape(-1)


def _spec_two_token(
    decoder: SpecDecoder, prompt: list[int], n: int
) -> tuple[torch.Tensor, int, int]:
    ids = list(range(n))
    decoder.add_requests(ids, [prompt] * n)
    out: dict[int, list[int]] = {i: [] for i in ids}
    accepted = rejected = 0
    while ids:
        step = decoder.step(ids)
        accepted += int(step.num_accepted.sum())
        rejected += int((step.num_accepted < step.num_draft_tokens).sum())
        for row, rid in enumerate(step.request_ids):
            out[rid].extend(step.tokens(row))  # type: ignore[index]
        for rid in [r for r in ids if len(out[r]) >= 2]:
            ids.remove(rid)
            decoder.release(rid)
    v = decoder.drafter.vocab_size
    pairs = torch.tensor([out[i][0] * v + out[i][1] for i in out])
    return torch.bincount(pairs, minlength=v * v).float(), accepted, rejected


# The prefix scheduler (DSpark Algorithm 1, early stop) on a roofline SPS curve verifies drafts
# 1..2 for a data-dependent subset: whether draft 2 is verified depends on the sampled draft 1
# (through c_2), which must not bias the output.
_PREFIX = PrefixScheduler(SPSCurve.roofline(weight_read_s=5e-3, per_token_s=2e-7))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("temperature", "scheduler", "draft_vocab"),
    [
        (1.0, RaggedScheduler(0.0, [0, 1, 2, 4]), None),
        (0.8, RaggedScheduler(0.0), None),
        (1.0, _PREFIX, None),
        # A draft vocabulary: the tokens outside it are still emitted, only never drafted.
        (1.0, RaggedScheduler(0.0), [5, 0, 9, 2, 7, 11, 3, 14, 1, 8]),
    ],
    ids=["ragged", "full", "prefix-scheduler", "draft-vocab"],
)
def test_sampling_is_lossless(
    temperature: float, scheduler: VerifyScheduler, draft_vocab: list[int] | None
) -> None:
    model = TinyTarget(vocab_size=16, hidden_size=32, num_layers=2, logit_scale=2.0, seed=3)
    target = RecomputeTarget(model)
    drafter = make_drafter(target, seed=1, gamma=3)
    if draft_vocab is not None:
        drafter = drafter.restrict_vocab(draft_vocab)
    gen = torch.Generator().manual_seed(1234)
    decoder = SpecDecoder(
        drafter, target, scheduler, max_requests=4000, temperature=temperature, generator=gen
    )
    prompt = [3, 7, 1, 12, 5, 9, 9, 2, 14, 0, 6]  # longer than the window (8)
    counts, accepted, rejected = _spec_two_token(decoder, prompt, 4000)
    assert accepted > 500 and rejected > 500  # both verification branches are exercised
    exact = _exact_two_token(model, prompt, temperature)
    assert _chi_square_z(counts, exact) < 3.1  # p > 0.001
    # The same statistic rejects a nearby wrong distribution, so it has power at this size.
    wrong = _exact_two_token(model, prompt, temperature * 1.25)
    assert _chi_square_z(counts, wrong) > 3.1


def test_greedy_matches_plain_greedy_token_for_token(tiny_model: TinyTarget) -> None:
    target = RecomputeTarget(tiny_model)
    drafter = make_drafter(target, seed=2)
    decoder = SpecDecoder(
        drafter, target, RaggedScheduler(0.0, [4, 0, 1, 3, 2]), max_requests=32, temperature=0
    )
    g = torch.Generator().manual_seed(5)
    lengths = [1, 2, 3, 5, 7, 8, 9, 12, 17, 25] * 2
    prompts = [torch.randint(0, 32, (n,), generator=g).tolist() for n in lengths]
    spec = decoder.generate(prompts, max_new_tokens=14)
    for prompt, got in zip(prompts, spec):
        assert got == tiny_model.greedy(prompt, 14)
    assert decoder.request_ids == [] and target.length(("generate", 0)) == 0


def test_greedy_with_an_accurate_drafter_accepts_much_and_stays_exact(
    tiny_model: TinyTarget,
) -> None:
    """Random tiny targets fall into bigram loops under greedy decoding; a drafter whose Markov
    head encodes the target's most frequent greedy bigrams (on these prompts) gets most drafts accepted, which
    exercises long accepted prefixes, truncation and ring updates; output stays exact."""
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 32, (n,), generator=g).tolist() for n in (1, 4, 9, 13, 20)]
    expected = [tiny_model.greedy(p, 24) for p in prompts]
    votes = torch.zeros(32, 32)
    for prompt, text in zip(prompts, expected):
        seq = prompt[-1:] + text
        for a, b in itertools.pairwise(seq):
            votes[a, b] += 1
    target = RecomputeTarget(tiny_model)
    drafter = make_drafter(target, seed=2, markov_rank=32)
    with torch.no_grad():
        drafter.markov_in.weight.copy_(torch.eye(32))
        drafter.markov_out.weight.copy_(30.0 * torch.nn.functional.one_hot(votes.argmax(1), 32).T)
    decoder = SpecDecoder(drafter, target, RaggedScheduler(0.0), temperature=0)
    decoder.add_requests(list(range(5)), prompts)
    texts: list[list[int]] = [[] for _ in prompts]
    accepted = verified = 0
    while min(len(t) for t in texts) < 24:
        step = decoder.step()
        accepted += int(step.num_accepted.sum())
        verified += int(step.num_draft_tokens.sum())
        for row in range(5):
            texts[row].extend(step.tokens(row))
    assert accepted > verified // 2
    for want, text in zip(expected, texts):
        assert text[:24] == want


def test_state_equals_a_fresh_prefill_of_the_accepted_text(tiny_model: TinyTarget) -> None:
    """After partial rejections, ring and target history are those of the accepted text only."""
    target = RecomputeTarget(tiny_model)
    drafter = make_drafter(target, seed=4)
    gen = torch.Generator().manual_seed(9)
    decoder = SpecDecoder(drafter, target, RaggedScheduler(0.0, [4, 2]), generator=gen)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11, 12, 13]]
    decoder.add_requests(["a", "b"], prompts)
    texts = [list(p) for p in prompts]
    rejections = 0
    for _ in range(6):
        step = decoder.step()
        rejections += int((step.num_accepted < step.num_draft_tokens).sum())
        for row in range(2):
            texts[row].extend(step.tokens(row))
    assert rejections > 0
    fresh = SpecDecoder(drafter, RecomputeTarget(tiny_model), RaggedScheduler(0.0))
    fresh.add_requests(["a", "b"], texts)
    for rid, text in zip(["a", "b"], texts):
        assert target.length(rid) == len(text) - 1
        live = decoder.request_state(rid)
        ref = fresh.request_state(rid)
        assert (live.anchor, live.length) == (ref.anchor, ref.length) == (text[-1], len(text) - 1)
        a_feats, a_valid = decoder.spec.context.view([rid])
        b_feats, b_valid = fresh.spec.context.view([rid])
        assert torch.equal(a_valid, b_valid)
        torch.testing.assert_close(a_feats, b_feats, rtol=1e-4, atol=1e-5)


def test_generate_stops_at_stop_tokens(tiny_model: TinyTarget) -> None:
    target = RecomputeTarget(tiny_model)
    decoder = SpecDecoder(make_drafter(target), target, RaggedScheduler(), temperature=0)
    prompt = [4, 9, 2]
    plain = tiny_model.greedy(prompt, 10)
    stop = plain[2]
    cut = plain.index(stop) + 1
    assert decoder.generate([prompt], 10, stop_token_ids=[stop]) == [plain[:cut]]
    assert decoder.generate([prompt, [1]], 1) == [plain[:1], tiny_model.greedy([1], 1)]
    with pytest.raises(ValueError, match="max_new_tokens"):
        decoder.generate([prompt], 0)


class _BadScheduler:
    def __init__(self, result: torch.Tensor) -> None:
        self.result = result

    def schedule(self, confidence: torch.Tensor) -> torch.Tensor:
        return self.result


@pytest.mark.parametrize(
    ("result", "error", "match"),
    [
        (torch.tensor([5]), ValueError, r"\[0, 4\]"),
        (torch.tensor([-1]), ValueError, r"\[0, 4\]"),
        (torch.tensor([1, 1]), ValueError, "shape"),
        (torch.tensor([1.0]), TypeError, "integer"),
    ],
)
def test_bad_schedules_raise(
    target: RecomputeTarget, result: torch.Tensor, error: type, match: str
) -> None:
    decoder = SpecDecoder(make_drafter(target), target, _BadScheduler(result))
    decoder.add_request("r", [1, 2])
    with pytest.raises(error, match=match):
        decoder.step()


def test_bad_requests_raise(target: RecomputeTarget) -> None:
    decoder = SpecDecoder(make_drafter(target), target, RaggedScheduler(), max_requests=2)
    with pytest.raises(ValueError, match="empty prompt"):
        decoder.add_request("r", [])
    with pytest.raises(ValueError, match="outside"):
        decoder.add_request("r", [1, 32])
    decoder.add_request("r", [1])
    with pytest.raises(ValueError, match="already active"):
        decoder.add_request("r", [1])
    with pytest.raises(ValueError, match="free slots"):
        decoder.add_requests(["x", "y"], [[1], [2]])
    with pytest.raises(ValueError, match="unknown"):
        decoder.step(["nope"])
    with pytest.raises(ValueError, match="temperature"):
        SpecDecoder(make_drafter(target), target, RaggedScheduler(), temperature=-0.5)
    other = RecomputeTarget(TinyTarget(vocab_size=16))
    with pytest.raises(ValueError, match="vocab"):
        SpecDecoder(make_drafter(target), other, RaggedScheduler())
