"""A GGUF model's decode steps take the compiled block-format layer (``QuantDecoderLayerKernel``)
and compute what its per-op path computes: logits within 1e-4, the same greedy tokens."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from model_helpers import greedy_paged, one_thread
from quant_helpers import quant_config, write_quant_gguf

from deepinfer.models import AttentionMetadata, KVPool, LlamaModel
from deepinfer.models.gguf_model import load_gguf_model
from deepinfer.models.layers import Linear
from deepinfer_kernels.cpu import LayerBlocks, QuantDecoderLayerKernel, compiler_available

pytestmark = pytest.mark.skipif(not compiler_available(), reason="no C compiler")
_threads = pytest.fixture(scope="module", autouse=True)(one_thread)

MIXES = {
    "legacy": {"attn_q": "Q4_0", "attn_k": "Q4_1", "attn_v": "Q8_0", "attn_output": "Q4_1",
               "ffn_gate": "Q4_0", "ffn_up": "Q4_1", "ffn_down": "Q8_0", "token_embd": "Q8_0"},
    "k-quants": {"attn_q": "Q4_K", "attn_k": "Q5_K", "attn_v": "Q6_K", "attn_output": "Q4_K",
                 "ffn_gate": "Q5_K", "ffn_up": "Q4_K", "ffn_down": "Q6_K", "token_embd": "Q6_K"},
    # attn_output and ffn_down stay F32: plain float projections next to block-format ones.
    "floats": {"attn_q": "F16", "attn_k": "BF16", "attn_v": "F32", "ffn_gate": "BF16",
               "ffn_up": "F16", "token_embd": "F16"},
}  # fmt: skip


def _per_op(model: LlamaModel) -> LlamaModel:
    model.use_cpu_kernels(dataclasses.replace(model.cpu_kernels, quant_layer=None))
    return model


def _decode_logits(model: LlamaModel, prompt: list[int], steps: int) -> list[torch.Tensor]:
    """Logits of the prompt's last position and of ``steps`` greedy one-row decode steps."""
    pool = KVPool.for_model(model.config, 4, 16)
    table = pool.allocate(4)
    feed, done, out = list(prompt), 0, []
    with torch.inference_mode():
        for _ in range(steps + 1):
            attn = AttentionMetadata.build([table], [done + len(feed)], [len(feed)], 16)
            logits = model.compute_logits(model(torch.tensor(feed), attn.positions(), attn, pool))
            out.append(logits[-1])
            done += len(feed)
            feed = [int(logits[-1].argmax())]
    return out


class _CountingCalls:
    """A kernel half (``NativeFunction``) that counts its calls."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.calls = fn, 0

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        return self.fn(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fn, name)


@pytest.mark.parametrize("mix", list(MIXES))
def test_decode_takes_the_fused_layer_and_matches_the_per_op_path(tmp_path: Path, mix: str) -> None:
    cfg = quant_config()
    path = write_quant_gguf(tmp_path / f"{mix}.gguf", cfg, MIXES[mix], seed=3)
    fused, per_op = load_gguf_model(path), _per_op(load_gguf_model(path))
    if mix == "floats":
        assert type(fused.decoder_layers()[0].self_attn.o_proj) is Linear
    blocks = fused.layer_blocks.get()
    assert blocks is not None and len(blocks) == cfg.num_layers
    assert all(isinstance(b, LayerBlocks) for b in blocks)
    calls = {"n": 0}
    kernel = fused.cpu_kernels.quant_layer
    assert isinstance(kernel, QuantDecoderLayerKernel)
    original = kernel.bind

    def counting_bind(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        return original(*args, **kwargs)

    mlp = _CountingCalls(kernel._mlp)
    kernel.bind = counting_bind  # type: ignore[method-assign]
    kernel._mlp = mlp  # type: ignore[assignment]
    prompt = [5, 9, 13, 2, 7]
    got, want = _decode_logits(fused, prompt, 6), _decode_logits(per_op, prompt, 6)
    # Bound once per batch size (the 5-row prefill, then one-row decode steps), and every
    # step ran its layers on the compiled calls.
    assert calls["n"] == 2
    assert mlp.calls == 7 * cfg.num_layers
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=0)
    assert greedy_paged(fused, prompt, 10) == greedy_paged(per_op, prompt, 10)


def test_a_modified_weight_is_never_served_from_old_blocks(tmp_path: Path) -> None:
    cfg = quant_config()
    path = write_quant_gguf(tmp_path / "m.gguf", cfg, MIXES["legacy"], seed=4)
    model = load_gguf_model(path)
    first = model.layer_blocks.get()
    assert first is not None and model.layer_blocks.get() is first  # kept while current
    proj = model.decoder_layers()[1].mlp.down_proj
    row = proj.parts()[0].data.shape[1]
    with torch.no_grad():  # the rows in another order (valid blocks, other weights)
        proj.weight.copy_(torch.roll(proj.weight, row))
    assert model.layer_blocks.get() is not first
    ref = _per_op(load_gguf_model(path))
    ref_proj = ref.decoder_layers()[1].mlp.down_proj
    with torch.no_grad():
        ref_proj.weight.copy_(torch.roll(ref_proj.weight, row))
    torch.testing.assert_close(
        _decode_logits(model, [3, 4], 2)[-1], _decode_logits(ref, [3, 4], 2)[-1], atol=1e-4,
        rtol=0,
    )  # fmt: skip


def test_float_models_keep_their_own_paths() -> None:
    """A model without block-format projections is not taken (its bf16 panels / MKL paths
    serve it), and the refusal is cached."""
    from model_helpers import tiny_config

    model = LlamaModel(tiny_config())
    assert model.layer_blocks.get() is None
    assert model.layer_blocks.get() is None
