"""A model running on every compiled CPU kernel at once decodes as it does on torch ops."""

from __future__ import annotations

import pytest
import torch
from model_helpers import built, greedy_paged, tiny_config

from deepinfer.models import AttentionMetadata, KVPool, LlamaModel
from deepinfer.models.cpu_kernels import CpuKernels


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> CpuKernels:
    kernels = CpuKernels.all(cache_dir=tmp_path_factory.mktemp("kernels"), enabled=True)
    for k in (kernels.linear, kernels.norm, kernels.attention, kernels.layer):
        built(k)
    return kernels


def test_a_new_model_starts_with_every_kernel() -> None:
    model = LlamaModel(tiny_config(), init=False)
    kernels = model.cpu_kernels
    assert kernels.linear is not None and kernels.norm is not None
    assert kernels.attention is not None and kernels.layer is not None


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
