"""A model running on every compiled CPU kernel at once decodes as it does on torch ops."""

from __future__ import annotations

import pytest
import torch
from model_helpers import built, greedy_paged, tiny_config

from deepinfer.models import AttentionMetadata, KVPool, LlamaModel
from deepinfer_kernels.cpu import CpuKernels, PagedAttentionTiles
from deepinfer_kernels.cpu.add_rms_norm import AddRmsNorm
from deepinfer_kernels.cpu.bf16_weight_linear import Bf16WeightLinear
from deepinfer_kernels.cpu.decoder_layer import DecoderLayerKernel


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> CpuKernels:
    kernels = CpuKernels.all(cache_dir=tmp_path_factory.mktemp("kernels"), enabled=True)
    for k in (kernels.linear, kernels.norm, kernels.attention, kernels.layer):
        built(k)
    return kernels


def test_a_new_model_starts_with_every_kernel() -> None:
    model = LlamaModel(tiny_config(), init=False)
    kernels = model.cpu_kernels
    # Each field holds its own kernel (a swapped or missing one would run the wrong code).
    assert isinstance(kernels.linear, Bf16WeightLinear)
    assert isinstance(kernels.norm, AddRmsNorm)
    assert isinstance(kernels.attention, PagedAttentionTiles)
    assert isinstance(kernels.layer, DecoderLayerKernel)


def test_model_on_every_kernel_decodes_like_torch(kernels: CpuKernels) -> None:
    """Paged prefill + decode of a tiny model with bf16-exact weights: the greedy tokens are
    the same and one forward's logits agree to fp32 rounding."""
    model = LlamaModel(tiny_config(num_layers=3), init=False)
    model.init_weights(generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(param.bfloat16().float())
    prompt = [5, 9, 17, 3, 40, 41, 42, 7, 8, 100]
    model.use_cpu_kernels(kernels)
    fast = greedy_paged(model, prompt, 12)
    model.use_cpu_kernels(CpuKernels())
    plain = greedy_paged(model, prompt, 12)
    assert fast == plain
    pool = KVPool.for_model(model.config, 2, 16)
    attn = AttentionMetadata.build([pool.allocate(2)], [len(prompt)], [len(prompt)], 16)
    ids = torch.tensor(prompt)
    with torch.inference_mode():
        model.use_cpu_kernels(kernels)
        a = model.compute_logits(model(ids, attn.positions(), attn, pool))
        model.use_cpu_kernels(CpuKernels())
        b = model.compute_logits(model(ids, attn.positions(), attn, pool))
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_model_logits_match_with_and_without_the_kernel(kernels: CpuKernels) -> None:
    """A tiny model with bf16-exact weights: decode-sized forwards on the kernel give the
    logits of the plain path, and the kernel was really used."""
    model = LlamaModel(tiny_config(), init=False)
    model.init_weights(generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(param.bfloat16().float())
    ids = torch.tensor([[5, 9, 17, 3, 40]])
    with torch.inference_mode():
        model.use_cpu_kernels(CpuKernels(linear=kernels.linear))
        hidden, _ = model.forward_dense(ids)
        fast = model.compute_logits(hidden[0])
        qkv = model.decoder_layers()[0].self_attn.qkv_proj
        assert qkv.packed.has_bf16  # the kernel path prepared its panels
        model.use_cpu_kernels(CpuKernels())
        hidden, _ = model.forward_dense(ids)
        plain = model.compute_logits(hidden[0])
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-5)


def test_model_forward_matches_without_kernels(kernels: CpuKernels) -> None:
    """A tiny model's hidden states and captured layer outputs with the fused norms equal the
    torch-op forward."""
    model = LlamaModel(tiny_config(), init=False)
    model.init_weights(generator=torch.Generator().manual_seed(7))
    ids = torch.tensor([[5, 9, 17, 3, 40, 41]])
    with torch.inference_mode():
        model.use_cpu_kernels(CpuKernels(norm=kernels.norm))
        fast, fast_layers = model.forward_dense(ids, layer_ids=[0, 1])
        model.use_cpu_kernels(CpuKernels())
        plain, plain_layers = model.forward_dense(ids, layer_ids=[0, 1])
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-5)
    for a, b in zip(fast_layers, plain_layers):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
