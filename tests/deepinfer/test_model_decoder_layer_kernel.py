"""The compiled decoder layer (``CpuKernels.layer``) against the model's torch ops.

A step on the kernel must give the torch path's hidden states, captured layer outputs and K/V
writes to fp32 rounding, for any layer shape (GQA ratios, odd head dims, QKV bias), ragged
batches mixing decodes and short chunks, and must leave every step it does not apply to on
torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from model_helpers import built, tiny_config

from deepinfer.models import AttentionMetadata, KVPool, LlamaModel
from deepinfer_kernels.cpu import CpuKernels, PagedAttentionTiles
from deepinfer_kernels.cpu.bound_layers import BoundLayers
from deepinfer_kernels.cpu.decoder_layer import (
    DecoderLayerKernel,
    LayerPanels,
    LayerShape,
    SlotMapping,
)

BLOCK = 4


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> DecoderLayerKernel:
    return built(DecoderLayerKernel(cache_dir=tmp_path_factory.mktemp("kernels"), enabled=True))


@pytest.fixture(scope="module")
def tiles(tmp_path_factory: pytest.TempPathFactory) -> PagedAttentionTiles:
    return built(PagedAttentionTiles(cache_dir=tmp_path_factory.mktemp("tiles"), enabled=True))


def fused_panels(
    model: LlamaModel, x: torch.Tensor, pool: KVPool, meta: AttentionMetadata
) -> tuple[LayerPanels, ...] | None:
    """What a forward of ``x`` hands the compiled layer: the kernel's verdict on the step
    (``DecoderLayerKernel.applies``), then the model's bound panels (``model.layer_panels``)."""
    kernel = model.cpu_kernels.layer
    if kernel is None or not kernel.applies(x, pool.layer_caches(0)[0], meta.slot_mapping):
        return None
    return model.layer_panels.get()


def bf16_exact_model(seed: int = 0, **overrides: object) -> LlamaModel:
    model = LlamaModel(tiny_config(**overrides), init=False)
    model.init_weights(std=0.2, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(param.bfloat16().float())
        for layer in model.decoder_layers():
            if layer.self_attn.qkv_proj.bias is not None:
                layer.self_attn.qkv_proj.bias.normal_(0.0, 0.1)
    return model


def step(
    model: LlamaModel,
    kernels: CpuKernels,
    pool: KVPool,
    tables: list[list[int]],
    seq_lens: list[int],
    query_lens: list[int],
    ids: torch.Tensor,
    layer_ids: list[int],
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.use_cpu_kernels(kernels)
    attn = AttentionMetadata.build(tables, seq_lens, query_lens, BLOCK)
    with torch.inference_mode():
        return model.forward_with_layers(ids, attn.positions(), attn, pool, layer_ids)


def ragged_step_matches(
    model: LlamaModel,
    kernel: DecoderLayerKernel,
    history: list[int],
    query_lens: list[int],
    seed: int,
    tiles: PagedAttentionTiles | None = None,
) -> None:
    """Prefill ``history[b]`` tokens per sequence on torch, then run one step of
    ``query_lens[b]`` new tokens per sequence on each path (from copies of the pool); with
    ``tiles`` the kernel path also attends on the compiled tiles (bound for all layers where
    the plan allows)."""
    cfg = model.config
    gen = torch.Generator().manual_seed(seed)
    blocks = [-(-(h + q) // BLOCK) for h, q in zip(history, query_lens)]
    pool = KVPool.for_model(cfg, sum(blocks) + 1, BLOCK)
    tables = [pool.allocate(n) for n in blocks]
    torch_ops = CpuKernels()
    done = [b for b, h in enumerate(history) if h]
    if done:
        ids = torch.randint(0, cfg.vocab_size, (sum(history),), generator=gen)
        step(
            model,
            torch_ops,
            pool,
            [tables[b] for b in done],
            [history[b] for b in done],
            [history[b] for b in done],
            ids,
            [],
        )
    seq_lens = [h + q for h, q in zip(history, query_lens)]
    ids = torch.randint(0, cfg.vocab_size, (sum(query_lens),), generator=gen)
    layer_ids = sorted({0, cfg.num_layers - 1})
    other = KVPool.for_model(cfg, pool.num_blocks, BLOCK)
    other.tensor.copy_(pool.tensor)
    fused = CpuKernels(layer=kernel, attention=tiles)
    model.use_cpu_kernels(fused)
    with torch.inference_mode():
        x = torch.zeros(ids.shape[0], cfg.hidden_size)
        assert fused_panels(model, x, pool, _meta(tables, seq_lens, query_lens)) is not None
    got, got_layers = step(model, fused, pool, tables, seq_lens, query_lens, ids, layer_ids)
    want, want_layers = step(model, torch_ops, other, tables, seq_lens, query_lens, ids, layer_ids)
    # The products sum in another order than torch's: fp32 rounding, relative to the tensor's
    # scale, grows a little with every layer.
    for a, b in zip([got, pool.tensor, *got_layers], [want, other.tensor, *want_layers]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5 * max(1.0, float(b.abs().max())))


def _meta(tables: list[list[int]], seq_lens: list[int], query_lens: list[int]) -> AttentionMetadata:
    return AttentionMetadata.build(tables, seq_lens, query_lens, BLOCK)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    kv_heads=st.sampled_from([1, 2, 4]),
    group=st.sampled_from([1, 2, 3]),
    head_dim=st.sampled_from([2, 6, 16, 34]),
    intermediate=st.integers(1, 70),
    bias=st.booleans(),
    seqs=st.lists(st.tuples(st.integers(0, 11), st.integers(1, 5)), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
    with_tiles=st.booleans(),
)
def test_any_layer_shape_and_ragged_step_matches_torch(
    kernel: DecoderLayerKernel,
    tiles: PagedAttentionTiles,
    kv_heads: int,
    group: int,
    head_dim: int,
    intermediate: int,
    bias: bool,
    seqs: list[tuple[int, int]],
    seed: int,
    with_tiles: bool,
) -> None:
    heads = kv_heads * group
    model = bf16_exact_model(
        seed,
        hidden_size=heads * head_dim + 3,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        attention_bias=bias,
    )
    history, query_lens = [h for h, _ in seqs], [q for _, q in seqs]
    ragged_step_matches(model, kernel, history, query_lens, seed, tiles if with_tiles else None)


def test_one_decode_row_at_a_block_boundary(
    kernel: DecoderLayerKernel, tiles: PagedAttentionTiles
) -> None:
    ragged_step_matches(bf16_exact_model(3), kernel, [BLOCK], [1], seed=3)
    ragged_step_matches(bf16_exact_model(4), kernel, [BLOCK - 1], [1], seed=4, tiles=tiles)


class CountingTiles(PagedAttentionTiles):
    """Counts foreign calls of the kernel (``calls``) and calls through ``run`` (``unbound``):
    a bound layer is a foreign call without ``run``."""

    def __init__(self, cache_dir: Path) -> None:
        super().__init__(cache_dir=cache_dir, enabled=True)
        self.calls = self.unbound = 0
        native = self.fn

        class Counting:
            def available(_) -> bool:  # type: ignore[no-untyped-def]
                return native.available()

            def __call__(_, *args):  # type: ignore[no-untyped-def]
                self.calls += 1
                return native(*args)

        self.fn = Counting()  # type: ignore[assignment]

    def run(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.unbound += 1
        return super().run(*args, **kwargs)


@pytest.mark.parametrize(
    ("history", "query_lens", "bound"),
    [
        ([9], [1], True),  # a decode step
        ([9], [3], True),  # a verification step: one tile of 3 queries
        ([9], [6], True),  # a verification step of more queries than a block holds
        ([9, 2, 13], [1, 1, 1], True),  # a batch of decodes of different lengths
        ([9, 2], [1, 4], False),  # decode and verification rows: rows are gathered
    ],
)
def test_decode_and_verification_steps_attend_through_bound_layers(
    kernel: DecoderLayerKernel,
    tmp_path: Path,
    history: list[int],
    query_lens: list[int],
    bound: bool,
) -> None:
    """The steps a decode loop runs attend through the layers' bound calls (one foreign call
    per layer, no ``run``); the others run it layer by layer; both match the torch ops."""
    tiles = built(CountingTiles(tmp_path))
    model = bf16_exact_model(11)
    ragged_step_matches(model, kernel, history, query_lens, seed=11, tiles=tiles)
    layers = model.config.num_layers
    assert (tiles.calls, tiles.unbound) == ((layers, 0) if bound else (layers, layers))


def test_panels_are_checked_once_while_they_do_not_change(
    kernel: DecoderLayerKernel,
) -> None:
    model = bf16_exact_model(12)
    pool = KVPool.for_model(model.config, 4, BLOCK)
    x = torch.zeros(1, model.config.hidden_size)
    model.use_cpu_kernels(CpuKernels(layer=kernel))
    with torch.inference_mode():
        first = fused_panels(model, x, pool, _meta([[0]], [1], [1]))
        assert first is not None
        assert fused_panels(model, x, pool, _meta([[0]], [1], [1])) is first
    with torch.no_grad():
        model.decoder_layers()[0].self_attn.o_proj.weight.mul_(2.0)
    with torch.inference_mode():
        second = fused_panels(model, x, pool, _meta([[0]], [1], [1]))
    assert second is not None and second is not first
    assert second[0].o is not first[0].o and second[1].o is first[1].o
    # A replaced parameter (same values, new tensor) and a new QKV bias are seen too.
    att = model.decoder_layers()[1].self_attn
    att.o_proj.weight = torch.nn.Parameter(att.o_proj.weight.detach().clone())
    with torch.inference_mode():
        third = fused_panels(model, x, pool, _meta([[0]], [1], [1]))
    assert third is not None and third is not second and third[1].o is not second[1].o
    att.qkv_proj.bias = torch.nn.Parameter(torch.zeros(att.qkv_proj.weight.shape[0]))
    with torch.inference_mode():
        fourth = fused_panels(model, x, pool, _meta([[0]], [1], [1]))
    assert fourth is not None and fourth[1].qkv_bias is not None and third[1].qkv_bias is None


def test_thirty_two_rows_take_the_kernel(kernel: DecoderLayerKernel) -> None:
    ragged_step_matches(bf16_exact_model(5), kernel, [0, 7], [16, 16], seed=5)
    # A chunk longer than the attention tiles' 16 queries: its attention runs on SDPA.
    ragged_step_matches(bf16_exact_model(9), kernel, [3, 0], [25, 7], seed=9)


class CountingLayer(DecoderLayerKernel):
    """Counts the steps a forward bound to the compiled layer."""

    def __init__(self, cache_dir: Path) -> None:
        super().__init__(cache_dir=cache_dir, enabled=True)
        self.binds = 0

    def bind(self, *args: Any, **kwargs: Any) -> BoundLayers:
        self.binds += 1
        return super().bind(*args, **kwargs)


def test_steps_it_does_not_apply_to_stay_on_torch(tmp_path: Path) -> None:
    """Real forwards: a one-row fp32 step takes the compiled layer; 33 rows, padding slots,
    autograd and a weight that is not bf16-exact keep the torch ops."""
    layer = built(CountingLayer(tmp_path))
    model = bf16_exact_model(6)
    model.use_cpu_kernels(CpuKernels(layer=layer))
    cfg = model.config
    pool = KVPool.for_model(cfg, 20, BLOCK)
    table = pool.allocate(20)

    def forward(rows: int, history: int = 0, padding: bool = False) -> int:
        before = layer.binds
        ids = torch.arange(rows) % cfg.vocab_size
        meta = _meta([table], [history + rows], [rows])
        if padding:
            meta.slot_mapping[-1] = -1
        model(ids, meta.positions(), meta, pool)
        return layer.binds - before

    with torch.inference_mode():
        assert forward(1) == 1
        assert forward(32) == 1
        assert forward(33) == 0
        assert forward(2, padding=True) == 0
    # Autograd on: the kernel declines the step (it has no backward).
    assert not layer.applies(torch.zeros(1, cfg.hidden_size), pool.layer_caches(0)[0],
                             torch.tensor([0]))  # fmt: skip
    with torch.no_grad():
        model.decoder_layers()[0].mlp.down_proj.weight[0, 0] += 1e-3  # not a bf16 value now
    with torch.inference_mode():
        assert forward(1) == 0
        assert model.layer_panels.get() is None


def test_a_reloaded_weight_is_never_served_from_old_panels(
    kernel: DecoderLayerKernel,
) -> None:
    model = bf16_exact_model(7)
    ragged_step_matches(model, kernel, [5], [1], seed=7)
    with torch.no_grad():
        model.decoder_layers()[1].mlp.gate_up_proj.weight.mul_(-1.0)
    ragged_step_matches(model, kernel, [5], [1], seed=7)


def test_bad_operands_are_refused_by_name(kernel: DecoderLayerKernel) -> None:
    model = bf16_exact_model(8)
    cfg = model.config
    shape = LayerShape(
        cfg.hidden_size,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.intermediate_size,
    )
    pool = KVPool.for_model(cfg, 2, BLOCK)
    k_cache, v_cache = pool.layer_caches(0)
    with torch.inference_mode():
        panels = fused_panels(model, torch.zeros(1, cfg.hidden_size), pool, _meta([[0]], [1], [1]))
    assert panels is not None
    d = cfg.head_dim
    x, out = torch.zeros(1, cfg.hidden_size), torch.zeros(1, shape.qkv_width)
    cos, sin = torch.ones(1, d), torch.zeros(1, d)
    slots = kernel.slot_mapping(torch.tensor([0]), 2 * BLOCK)
    kernel.qkv(x, panels[0], shape, cos, sin, slots, k_cache, v_cache, out)
    with pytest.raises(ValueError, match="slots"):
        kernel.slot_mapping(torch.tensor([2 * BLOCK]), 2 * BLOCK)
    with pytest.raises(ValueError, match="slots"):
        kernel.slot_mapping(torch.tensor([-1]), 2 * BLOCK)
    with pytest.raises(ValueError, match="slots"):
        kernel.qkv(
            x,
            panels[0],
            shape,
            cos,
            sin,
            SlotMapping(torch.tensor([0]), 99),
            k_cache,
            v_cache,
            out,
        )
    with pytest.raises(ValueError, match="slots"):
        SlotMapping(torch.tensor([10**9]), 8)  # built by hand: still checked
    with pytest.raises(ValueError, match="slots"):
        SlotMapping(torch.tensor([0], dtype=torch.int32), 8)
    swapped = LayerPanels(panels[0].o, None, panels[0].qkv, panels[0].gate_up, panels[0].down)
    with pytest.raises(ValueError, match=r"panels\.qkv"):
        kernel.qkv(x, swapped, shape, cos, sin, slots, k_cache, v_cache, out)
    with pytest.raises(ValueError, match=r"^x:"):
        kernel.qkv(x.double(), panels[0], shape, cos, sin, slots, k_cache, v_cache, out)
    with pytest.raises(ValueError, match=r"^out:"):
        kernel.qkv(x, panels[0], shape, cos, sin, slots, k_cache, v_cache, out[:, :-1])
    with pytest.raises(ValueError, match=r"^k_cache:"):
        kernel.qkv(x, panels[0], shape, cos, sin, slots, k_cache.double(), v_cache, out)
    with pytest.raises(ValueError, match=r"panels\.o:"):
        shape.check_panels(
            LayerPanels(panels[0].qkv, None, panels[0].qkv, panels[0].gate_up, panels[0].down)
        )
    residual, normed = torch.zeros(1, cfg.hidden_size), torch.zeros(1, cfg.hidden_size)
    w = torch.ones(cfg.hidden_size)
    attn = torch.zeros(1, cfg.q_size)
    with pytest.raises(ValueError, match="scratch"):
        kernel.mlp(attn, panels[0], shape, residual, normed, w, w, 1e-5, torch.zeros(3))
    with pytest.raises(ValueError, match="next_norm"):
        kernel.mlp(
            attn,
            panels[0],
            shape,
            residual,
            normed,
            w,
            w[:-1],
            1e-5,
            torch.zeros(10_000),
        )
    # bind: the same checks once for all layers, plus one operand per layer.
    layers = len(panels)
    caches = [pool.layer_caches(i) for i in range(layers)]
    ks, vs = [k for k, _ in caches], [v for _, v in caches]
    scratch = torch.zeros(shape.scratch_size(1))

    def bind(**change):  # type: ignore[no-untyped-def]
        args = {"panels": panels, "normed": normed, "qkv": out, "k_caches": ks, "v_caches": vs,
                "norms": [(w, w)] * layers, "scratch": scratch}  # fmt: skip
        args.update(change)
        return kernel.bind(shape, args["panels"], args["normed"], args["qkv"], cos, sin, slots,
                           args["k_caches"], args["v_caches"], attn, residual, args["norms"],
                           1e-5, args["scratch"])  # fmt: skip

    assert len(bind()) == layers
    with pytest.raises(ValueError, match="one per layer"):
        bind(v_caches=vs[:-1])
    with pytest.raises(ValueError, match=r"k_caches\[1\]"):
        bind(k_caches=[ks[0], ks[1][:1]])
    with pytest.raises(ValueError, match="next_norm"):
        bind(norms=[(w, w), (w, w[:-1])])
    with pytest.raises(ValueError, match="scratch"):
        bind(scratch=torch.zeros(3))
    with pytest.raises(ValueError, match=r"^out:"):
        bind(qkv=out[:, :-1])
    with pytest.raises(ValueError, match=r"panels\.qkv"):
        bind(panels=(swapped, *panels[1:]))


def test_without_a_compiler_the_model_keeps_its_torch_ops(
    tmp_path: Path, no_c_compiler: None
) -> None:
    layer = DecoderLayerKernel(cache_dir=tmp_path, enabled=True)
    model = bf16_exact_model(10)
    model.use_cpu_kernels(CpuKernels(layer=layer))
    pool = KVPool.for_model(model.config, 4, BLOCK)
    meta = _meta([pool.allocate(1)], [3], [3])
    ids = torch.tensor([5, 6, 7])
    with torch.inference_mode():
        with pytest.warns(RuntimeWarning, match="no C compiler"):
            assert fused_panels(model, torch.zeros(3, model.config.hidden_size), pool, meta) is None
        got = model(ids, meta.positions(), meta, pool)
        model.use_cpu_kernels(CpuKernels())
        want = model(ids, meta.positions(), meta, pool)
    assert torch.equal(got, want)
    assert layer.error is not None and "no C compiler" in layer.error


def test_env_switch_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPINFER_CPU_KERNELS", "0")
    assert not DecoderLayerKernel().available()
    assert CpuKernels.all(enabled=False).layer is not None
    assert not CpuKernels.all(enabled=False).layer.available()  # type: ignore[union-attr]
