"""The compiled CPU ops against their torch references (``deepinfer_kernels.reference.cpu``),
property-based, and their ``torch.library`` registrations (schema, fakes, mutation)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _cpu import built
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels.cpu import (
    AddRmsNorm,
    Bf16WeightLinear,
    DecoderLayerKernel,
    LayerPanels,
    LayerShape,
    PackedWeight,
    add_rms_norm,
    bf16_panels,
    linear,
)
from deepinfer_kernels.cpu import ops as cpu_ops
from deepinfer_kernels.reference import (
    add_rms_norm_reference,
    bf16_weight_linear_reference,
    decoder_mlp_reference,
    decoder_qkv_reference,
    unpack_panels_reference,
)
from deepinfer_kernels.testing.cpu import (
    CPU_OP_TOLERANCES,
    DecoderLayerCase,
    bf16_exact,
    decoder_layer_cases,
)


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    atol, rtol = CPU_OP_TOLERANCES[got.dtype]
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    torch.testing.assert_close(got, want, atol=atol * scale, rtol=rtol)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kernels")


@pytest.fixture(scope="module")
def norm(cache: Path) -> AddRmsNorm:
    return built(AddRmsNorm(cache, enabled=True))


@pytest.fixture(scope="module")
def bf16(cache: Path) -> Bf16WeightLinear:
    return built(Bf16WeightLinear(cache, enabled=True))


@pytest.fixture(scope="module")
def layer(cache: Path) -> DecoderLayerKernel:
    return built(DecoderLayerKernel(cache, enabled=True))


# ---------------------------------------------------------------- add_rms_norm
@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(0, 9),
    size=st.sampled_from([1, 15, 16, 17, 33, 64, 576]),
    with_delta=st.booleans(),
    eps=st.sampled_from([1e-6, 1e-5, 0.5]),
    scale=st.sampled_from([1e-3, 1.0, 1e3]),
    seed=st.integers(0, 2**16),
)
def test_add_rms_norm_matches_the_reference(
    norm: AddRmsNorm, rows: int, size: int, with_delta: bool, eps: float, scale: float, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    residual = torch.randn(rows, size, generator=gen) * scale
    delta = torch.randn(rows, size, generator=gen) * scale if with_delta else None
    weight = torch.randn(size, generator=gen)
    with torch.inference_mode():
        summed, normed = add_rms_norm(residual, delta, weight, eps, norm)
    want_sum, want_norm = add_rms_norm_reference(residual, delta, weight, eps)
    assert torch.equal(summed, want_sum)  # the same fp32 add
    close(normed, want_norm)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_add_rms_norm_other_dtypes_take_torch_and_match(
    norm: AddRmsNorm, dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(3)
    residual, delta = torch.randn(4, 40, generator=gen), torch.randn(4, 40, generator=gen)
    weight = torch.randn(40, generator=gen)
    args = (residual.to(dtype), delta.to(dtype), weight.to(dtype))
    with torch.inference_mode():
        _, normed = add_rms_norm(*args, 1e-5, norm)
    assert normed.dtype == dtype
    want = add_rms_norm_reference(*args, 1e-5)[1]
    if dtype == torch.float64:
        torch.testing.assert_close(normed, want)
    else:
        close(normed, want)


# ---------------------------------------------------------------- bf16 weight linear
@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 40),
    out_features=st.integers(1, 100),
    in_features=st.integers(1, 70),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_bf16_weight_linear_matches_the_reference(
    bf16: Bf16WeightLinear,
    rows: int,
    out_features: int,
    in_features: int,
    with_bias: bool,
    seed: int,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    weight = bf16_exact(out_features, in_features, gen=gen)
    panels = bf16_panels(weight)
    assert panels is not None
    assert torch.equal(unpack_panels_reference(panels, out_features), weight)
    x = torch.randn(rows, in_features, generator=gen)
    bias = torch.randn(out_features, generator=gen) if with_bias else None
    with torch.inference_mode():
        got = bf16(x, panels, out_features, bias)
    close(got, bf16_weight_linear_reference(x, panels, out_features, bias))


# ---------------------------------------------------------------- decoder layer halves
def _shape(case: DecoderLayerCase) -> LayerShape:
    return LayerShape(
        case.hidden, case.num_heads, case.num_kv_heads, case.head_dim, case.intermediate
    )


def _panels(case: DecoderLayerCase) -> LayerPanels:
    packed = [
        bf16_panels(w)
        for w in (case.qkv_weight, case.o_weight, case.gate_up_weight, case.down_weight)
    ]
    qkv, o, gate_up, down = (p for p in packed if p is not None)
    assert len(packed) == 4 and all(p is not None for p in packed)
    return LayerPanels(qkv, case.qkv_bias, o, gate_up, down)


@settings(max_examples=20, deadline=None)
@given(case=decoder_layer_cases())
def test_decoder_qkv_matches_the_reference(
    layer: DecoderLayerKernel, case: DecoderLayerCase
) -> None:
    """QKV product, RoPE on Q and K, K/V rows written at the slots; other slots untouched."""
    shape = _shape(case)
    k_cache, v_cache = case.k_cache.clone(), case.v_cache.clone()
    out = torch.empty(case.rows, shape.qkv_width)
    slots = layer.slot_mapping(case.slots, case.num_blocks * case.block_size)
    with torch.inference_mode():
        layer.qkv(case.x, _panels(case), shape, case.cos, case.sin, slots, k_cache, v_cache, out)
    want, want_k, want_v = decoder_qkv_reference(
        case.x, case.qkv_weight, case.qkv_bias, case.cos, case.sin, case.slots,
        case.k_cache, case.v_cache, case.num_heads, case.num_kv_heads,
    )  # fmt: skip
    close(out, want)
    close(k_cache, want_k)
    close(v_cache, want_v)


@settings(max_examples=20, deadline=None)
@given(case=decoder_layer_cases())
def test_decoder_mlp_matches_the_reference(
    layer: DecoderLayerKernel, case: DecoderLayerCase
) -> None:
    shape = _shape(case)
    residual = case.x.clone()
    normed = torch.empty_like(residual)
    scratch = torch.empty(shape.scratch_size(case.rows))
    with torch.inference_mode():
        layer.mlp(case.attn, _panels(case), shape, residual, normed, case.post_norm,
                  case.next_norm, case.eps, scratch)  # fmt: skip
    want_residual, want_normed = decoder_mlp_reference(
        case.attn, case.o_weight, case.x, case.post_norm, case.gate_up_weight,
        case.down_weight, case.next_norm, case.eps,
    )  # fmt: skip
    close(residual, want_residual)
    close(normed, want_normed)


# ---------------------------------------------------------------- torch.library ops
def _op_args(case: DecoderLayerCase) -> tuple[tuple[object, ...], tuple[object, ...]]:
    p = _panels(case)
    qkv = (case.x, p.qkv, case.qkv_bias, case.cos, case.sin, case.slots,
           case.k_cache.clone(), case.v_cache.clone(), case.num_heads, case.num_kv_heads)  # fmt: skip
    mlp = (case.attn, p.o, case.x.clone(), case.post_norm, p.gate_up, p.down,
           case.next_norm, case.eps)  # fmt: skip
    return qkv, mlp


@settings(max_examples=8, deadline=None)
@given(case=decoder_layer_cases(max_rows=6))
def test_registered_ops_equal_their_references(case: DecoderLayerCase) -> None:
    """The ops (on the process's default kernels where they build, torch otherwise) give the
    references' results and update the arguments they declare mutated."""
    qkv_args, mlp_args = _op_args(case)
    with torch.inference_mode():
        got = cpu_ops.decoder_layer_qkv_op(*qkv_args)
        normed = cpu_ops.decoder_layer_mlp_op(*mlp_args)
        summed, n = cpu_ops.add_rms_norm_op(case.x, None, case.post_norm, case.eps)
        y = cpu_ops.bf16_weight_linear_op(case.x, mlp_args[4], 2 * case.intermediate, None)
    want, want_k, want_v = decoder_qkv_reference(
        case.x, case.qkv_weight, case.qkv_bias, case.cos, case.sin, case.slots,
        case.k_cache, case.v_cache, case.num_heads, case.num_kv_heads,
    )  # fmt: skip
    close(got, want)
    close(qkv_args[6], want_k)  # type: ignore[arg-type]
    close(qkv_args[7], want_v)  # type: ignore[arg-type]
    want_residual, want_normed = decoder_mlp_reference(
        case.attn, case.o_weight, case.x, case.post_norm, case.gate_up_weight,
        case.down_weight, case.next_norm, case.eps,
    )  # fmt: skip
    close(mlp_args[2], want_residual)  # type: ignore[arg-type]
    close(normed, want_normed)
    assert summed is not case.x and torch.equal(summed, case.x)  # no alias out of an op
    close(n, add_rms_norm_reference(case.x, None, case.post_norm, case.eps)[1])
    close(y, case.x @ case.gate_up_weight.T)


def test_registered_ops_pass_opcheck() -> None:
    """Schemas, fakes (shapes under ``torch.compile``), declared mutations and dispatch."""
    from hypothesis import find

    case = find(decoder_layer_cases(max_rows=3), lambda c: c.qkv_bias is not None)
    qkv_args, mlp_args = _op_args(case)
    p = _panels(case)
    samples = [
        (cpu_ops.add_rms_norm_op, (case.x, case.attn[:, :1].expand(-1, case.hidden).contiguous(),
                                   case.post_norm, case.eps)),
        (cpu_ops.add_rms_norm_op, (case.x, None, case.post_norm, case.eps)),
        (cpu_ops.bf16_weight_linear_op, (case.x, p.gate_up, 2 * case.intermediate, None)),
        (cpu_ops.decoder_layer_qkv_op, qkv_args),
        (cpu_ops.decoder_layer_mlp_op, mlp_args),
    ]  # fmt: skip
    for op, args in samples:
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))


def test_add_rms_norm_and_linear_trace_under_torch_compile(norm: AddRmsNorm) -> None:
    """With a kernel handle, ``add_rms_norm`` becomes the registered op while dynamo traces
    (fullgraph: no break at the foreign call) and ``linear`` leaves the product to the
    compiler; both give the eager results."""
    gen = torch.Generator().manual_seed(5)
    r, d, w = (torch.randn(3, 40, generator=gen), torch.randn(3, 40, generator=gen),
               torch.rand(40, generator=gen))  # fmt: skip
    weight = bf16_exact(24, 40, gen=gen)
    pack = PackedWeight(None)

    def step(r: torch.Tensor, d: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        _, n = add_rms_norm(r, d, w, 1e-5, norm)
        return linear(n, weight, pack=pack)

    with torch.inference_mode():
        eager = step(r, d, w)
        traced = torch.compile(step, backend="eager", fullgraph=True)(r, d, w)
    close(traced, eager)
