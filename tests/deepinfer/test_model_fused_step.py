"""The compiled layer's calls bound once per batch size (``deepinfer.models.fused_step``): reused
between steps without changing what a step computes, and re-bound when what they point at
changes (another KV pool, a replaced norm weight)."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest
import torch
from model_helpers import one_thread
from quant_helpers import quant_config, write_quant_gguf

from deepinfer.models import AttentionMetadata, KVPool, LlamaModel
from deepinfer.models.gguf_model import load_gguf_model
from deepinfer_kernels.cpu import compiler_available

pytestmark = pytest.mark.skipif(not compiler_available(), reason="no C compiler")
_threads = pytest.fixture(scope="module", autouse=True)(one_thread)

TYPES = {"attn_q": "Q4_0", "attn_k": "Q4_1", "attn_v": "Q8_0", "attn_output": "Q4_1",
         "ffn_gate": "Q4_0", "ffn_up": "Q4_1", "ffn_down": "Q8_0", "token_embd": "Q8_0"}  # fmt: skip


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_quant_gguf(tmp_path_factory.mktemp("gguf") / "m.gguf", quant_config(), TYPES, 5)


def _per_op(model: LlamaModel) -> LlamaModel:
    model.use_cpu_kernels(dataclasses.replace(model.cpu_kernels, quant_layer=None))
    return model


class Decoder:
    """Greedy one-row decoding of one prompt on its own pool."""

    def __init__(self, model: LlamaModel, prompt: list[int], pool: KVPool | None = None) -> None:
        self.model, self.feed, self.done = model, list(prompt), 0
        self.pool = KVPool.for_model(model.config, 4, 16) if pool is None else pool
        self.table = self.pool.allocate(4)

    def step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(final hidden rows, logits of the last row) of one forward."""
        attn = AttentionMetadata.build([self.table], [self.done + len(self.feed)],
                                       [len(self.feed)], 16)  # fmt: skip
        with torch.inference_mode():
            hidden = self.model(torch.tensor(self.feed), attn.positions(), attn, self.pool)
            logits = self.model.compute_logits(hidden[-1])
        self.done += len(self.feed)
        self.feed = [int(logits.argmax())]
        return hidden, logits


def test_interleaved_pools_and_kept_outputs_match_the_per_op_path(path: Path) -> None:
    """Two requests on two pools take turns at the same batch size (the bound step is re-bound
    to each pool), and a step's returned hidden states are not changed by the next step."""
    fused, ref = load_gguf_model(path), _per_op(load_gguf_model(path))
    runs = [(Decoder(fused, p), Decoder(ref, p)) for p in ([5, 9, 13], [2, 7])]
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []
    for _ in range(5):
        for got, want in runs:
            (h, g), (h_ref, w) = got.step(), want.step()
            torch.testing.assert_close(g, w, atol=1e-4, rtol=0)
            torch.testing.assert_close(h, h_ref, atol=1e-4, rtol=0)
            kept.append((h, h.clone()))
    for h, copy in kept:
        assert torch.equal(h, copy)


def test_a_replaced_norm_weight_is_bound_again(path: Path) -> None:
    fused, ref = load_gguf_model(path), _per_op(load_gguf_model(path))
    a, b = Decoder(fused, [3, 4]), Decoder(ref, [3, 4])
    for _ in range(2):
        torch.testing.assert_close(a.step()[1], b.step()[1], atol=1e-4, rtol=0)
    for model in (fused, ref):
        norm = model.decoder_layers()[1].post_attention_layernorm
        norm.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, norm.weight.numel()))
    for _ in range(2):
        torch.testing.assert_close(a.step()[1], b.step()[1], atol=1e-4, rtol=0)


def test_two_threads_on_one_model_do_not_share_step_buffers(path: Path) -> None:
    """Two threads decode on one model and one pool at once (their own blocks): each gets
    the logits it gets alone."""
    fused, ref = load_gguf_model(path), _per_op(load_gguf_model(path))
    prompts = ([5, 9, 13], [2, 7, 11])
    want = []
    for p in prompts:
        alone = Decoder(ref, p)
        want.append([alone.step()[1] for _ in range(12)])
    got: list[list[torch.Tensor]] = [[], []]
    barrier = threading.Barrier(2)

    shared = KVPool.for_model(fused.config, 8, 16)

    def run(i: int) -> None:
        dec = Decoder(fused, prompts[i], shared)
        barrier.wait()
        got[i] = [dec.step()[1] for _ in range(12)]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for g, w in zip(got, want):
        assert len(g) == len(w)
        for a, b in zip(g, w):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


@pytest.mark.parametrize("rows", [2, 3, 4])
def test_verification_steps_take_the_bound_tile_and_match_the_per_op_path(
    path: Path, rows: int
) -> None:
    """A step of one sequence's last ``rows`` tokens (a DSpark verify: the token and its
    drafts) attends through the step's bound causal tile (``BoundStep.verify``, re-pointed
    every step), and every row's logits equal the per-op path's, over steps whose key counts
    cross a block boundary."""
    fused, ref = load_gguf_model(path), _per_op(load_gguf_model(path))
    got, want = Decoder(fused, [5, 9, 13, 2, 7]), Decoder(ref, [5, 9, 13, 2, 7])
    got.step(), want.step()
    for i in range(5):
        drafts = [(3 * i + r) % 17 + 1 for r in range(rows - 1)]
        outs = []
        for dec in (got, want):
            dec.feed = dec.feed + drafts
            attn = AttentionMetadata.build([dec.table], [dec.done + rows], [rows], 16)
            with torch.inference_mode():
                hidden = dec.model(torch.tensor(dec.feed), attn.positions(), attn, dec.pool)
                outs.append(dec.model.compute_logits(hidden))
            dec.done += rows
            dec.feed = [int(outs[-1][-1].argmax())]
        torch.testing.assert_close(outs[0], outs[1], atol=1e-4, rtol=0)
    steps = fused._bound_steps._steps
    verify = [s.verify for (n, _), s in steps.items() if n == rows]
    assert verify and verify[0] is not None  # the bound tile was built for this row count
