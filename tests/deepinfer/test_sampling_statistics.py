"""Chi-square checks of the engine's sampler against a reference sampler written out here:
penalties, logit bias and structured-output masks change the law exactly as specified, and a
mask applied to the target before speculative verification keeps verification lossless."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from model_helpers import random_hf_state, tiny_config, write_tiny_gguf

from deepinfer.engine import StructuredOutputsParams
from deepinfer.engine.output_processor import OutputProcessor
from deepinfer.engine.outputs import RequestMetrics
from deepinfer.engine.sampler import prepare_verify_logits, sample_next_tokens
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.engine.sequence import Sequence
from deepinfer.models import Tokenizer
from deepinfer.models.gguf_loader import open_gguf
from deepinfer_kernels import sampling_probs, speculative_verify
from deepinfer_kernels.sampling import unpack_bitmask

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "deepinfer_kernels"))
from _stats import assert_matches

DRAWS = 4000


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    cfg = tiny_config(num_layers=1)
    path = write_tiny_gguf(tmp_path_factory.mktemp("tok") / "t.gguf", cfg, random_hf_state(cfg))
    return Tokenizer.from_gguf(open_gguf(path))


def _seq(params: SamplingParams, prompt: list[int], output: list[int], proc: OutputProcessor):
    seq = Sequence(0, "r", list(prompt), params, b"", RequestMetrics(0.0))
    proc.track(seq)
    if output:
        proc.append(seq, output)
    return seq


def _reference_law(logits: torch.Tensor, prompt: list[int], output: list[int], p: SamplingParams):
    """vLLM's definitions, token by token, then softmax at the temperature."""
    x = logits.double().clone()
    for t in set(prompt) | set(output):
        x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t in set(output):
        x[t] -= p.frequency_penalty * output.count(t) + p.presence_penalty
    for t, b in (p.logit_bias or {}).items():
        x[t] += b
    return torch.softmax(x / p.temperature, dim=-1)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8, presence_penalty=1.2, max_tokens=50, ignore_eos=True),
        SamplingParams(temperature=1.0, frequency_penalty=0.7, max_tokens=50, ignore_eos=True),
        SamplingParams(temperature=1.3, repetition_penalty=2.5, max_tokens=50, ignore_eos=True),
        SamplingParams(temperature=1.0, logit_bias={3: 2.0, 9: -3.0}, max_tokens=50),
    ],
)
def test_penalised_sampling_matches_reference(params: SamplingParams) -> None:
    vocab = 16
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(vocab, generator=gen) * 1.5
    prompt, output = [0, 1, 2, 3], [4, 4, 5, 1, 4]
    proc = OutputProcessor(None, max_model_len=1000)
    seqs = [_seq(params, prompt, output, proc)] * DRAWS  # sampling leaves the state as it is
    tokens = sample_next_tokens(seqs, logits.expand(DRAWS, vocab), gen)
    want = _reference_law(logits, prompt, output, params)
    assert_matches(torch.tensor(tokens), want)
    plain = torch.softmax(logits.double() / params.temperature, -1)
    assert (want - plain).abs().max() > 0.02, "the setting must change the law"


def test_grammar_mask_sampling_matches_renormalised_law(tok: Tokenizer) -> None:
    params = SamplingParams(
        temperature=1.0, structured_outputs=StructuredOutputsParams(regex=r"(a|t|th|he)[a-z]*")
    )
    vocab = tok.vocab_size
    proc = OutputProcessor(tok, max_model_len=1000, vocab_size=vocab)
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(vocab, generator=gen)
    probe = _seq(params, [5], [], proc)
    assert probe.state is not None and probe.state.grammar is not None
    allowed = unpack_bitmask(probe.state.grammar.bitmask()[None], vocab)[0]
    assert 2 <= int(allowed.sum()) < vocab // 4
    seqs = [probe] * DRAWS  # sampling does not advance the grammar
    tokens = torch.tensor(sample_next_tokens(seqs, logits.expand(DRAWS, vocab), gen))
    want = torch.where(allowed, torch.softmax(logits.double(), -1), 0.0)
    assert_matches(tokens, want / want.sum())


def test_masked_target_keeps_speculative_verification_lossless(tok: Tokenizer) -> None:
    """Drafts come from an unmasked draft law; the target is masked per block position (with
    the drafts' own grammar progress). The first emitted token must follow the masked target."""
    vocab = tok.vocab_size
    params = SamplingParams(
        temperature=1.0, structured_outputs=StructuredOutputsParams(regex="(t|h|e|a)+")
    )
    proc = OutputProcessor(tok, max_model_len=1000, vocab_size=vocab)
    seq = _seq(params, [5], [], proc)
    gen = torch.Generator().manual_seed(1)
    width = 3
    target_logits = torch.randn(1, width, vocab, generator=gen) * 2
    draft_logits = torch.randn(width - 1, vocab, generator=gen)
    allowed = unpack_bitmask(seq.state.grammar.bitmask()[None], vocab)[0]  # type: ignore[union-attr]
    # Put most draft mass on a few allowed and a few forbidden tokens.
    favour = torch.cat([allowed.nonzero().flatten()[:3], (~allowed).nonzero().flatten()[:3]])
    draft_logits[:, favour] += 4.0
    q = torch.softmax(draft_logits, -1)
    drafts = torch.multinomial(q, DRAWS, replacement=True, generator=gen).T  # [N, width - 1]
    # Each row of the batch is an independent step; the mask at position 0 does not depend on
    # the drafts, so position 0 of one processed block is the target law of every row.
    processed = prepare_verify_logits([seq], [drafts[0].tolist()], target_logits)
    one = torch.ones(1)
    p_t = sampling_probs(
        processed[0], one.expand(width), one.expand(width).long() * 0, one.expand(width)
    )
    res = speculative_verify(
        drafts[:, :1],
        q[:1].expand(DRAWS, 1, vocab),
        p_t[:2].expand(DRAWS, 2, vocab),
        torch.ones(DRAWS, dtype=torch.int64),
        generator=gen,
    )
    first = res.output_ids[:, 0]
    want = torch.where(allowed, torch.softmax(target_logits[0, 0].double(), -1), 0.0)
    assert_matches(first, want / want.sum())
    assert bool((~allowed[drafts[:, 0]]).any()), "some drafts were forbidden"


def test_block_masks_follow_the_drafts(tok: Tokenizer) -> None:
    params = SamplingParams(structured_outputs=StructuredOutputsParams(regex="the (heat|hat)"))
    proc = OutputProcessor(tok, max_model_len=1000, vocab_size=tok.vocab_size)
    seq = _seq(params, [5], [], proc)
    grammar = seq.state.grammar  # type: ignore[union-attr]
    drafts = tok.encode("the h")
    masks = grammar.masks_along(drafts, len(drafts) + 1)
    fresh = _seq(params, [5], [], proc).state.grammar  # type: ignore[union-attr]
    for j in range(len(drafts) + 1):
        assert torch.equal(masks[j], fresh.bitmask()), j
        if j < len(drafts):
            assert fresh.advance(drafts[j])
    assert torch.equal(grammar.bitmask(), masks[0])  # rolled back to where it started
    # A draft the grammar rejects: later positions repeat the rejecting position's mask.
    bad = [*tok.encode("the"), tok.encode("x")[0]]
    masks = grammar.masks_along(bad, len(bad) + 1)
    assert torch.equal(masks[-1], masks[-2])


def test_draft_mask_follows_the_grammar_through_the_drafts(tok: Tokenizer) -> None:
    from deepinfer.engine.draft_mask import DraftMask

    vocab = tok.vocab_size
    params = SamplingParams(structured_outputs=StructuredOutputsParams(regex="the (heat|hat)"))
    proc = OutputProcessor(tok, max_model_len=1000, vocab_size=vocab)
    seq = _seq(params, [5], [], proc)
    plain = _seq(SamplingParams(), [5], [], proc)
    grammar = seq.state.grammar  # type: ignore[union-attr]
    start = grammar.bitmask()
    drafts = tok.encode("the h")
    mask = DraftMask([plain, seq], vocab, None)
    assert mask.active and mask.rows == {1}
    fresh = _seq(params, [5], [], proc).state.grammar  # type: ignore[union-attr]
    for k in range(len(drafts) + 1):
        prefix = torch.tensor([drafts[:k], drafts[:k]])
        out = mask(torch.tensor([0, 1]), k, prefix, torch.zeros(2, vocab))
        assert bool(torch.isfinite(out[0]).all())  # the unconstrained row is untouched
        want = unpack_bitmask(fresh.bitmask()[None], vocab)[0]
        assert torch.equal(torch.isfinite(out[1]), want), k
        if k < len(drafts):
            fresh.advance(drafts[k])
    mask.close()
    assert torch.equal(grammar.bitmask(), start)  # rolled back
