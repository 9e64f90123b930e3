"""The compiled DSpark greedy block and context entries against their torch references."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels.cpu.dspark_draft import (
    DraftBlockWeights,
    DraftContextWeights,
    DraftLayerWeights,
    DSparkDraftKernel,
    dspark_context_kv_reference,
    dspark_greedy_draft_reference,
    op_reference,
)
from deepinfer_kernels.quant.formats import QuantType, QuantWeight
from deepinfer_kernels.quant.ops import dequantize


def _bf16(shape: tuple[int, ...], gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """Random fp32 values that are exactly bf16 values (what the panels keep)."""
    return (torch.randn(shape, generator=gen) * scale).bfloat16().float()


def _head_rows(qtype: QuantType, rows: int, cols: int, gen: torch.Generator) -> QuantWeight:
    if qtype == QuantType.F32:
        values = torch.randn(rows, cols, generator=gen) / cols**0.5
        return QuantWeight(values.contiguous().view(torch.uint8), qtype, cols)
    if qtype == QuantType.BF16:
        values = (torch.randn(rows, cols, generator=gen) / cols**0.5).bfloat16()
        return QuantWeight(values.contiguous().view(torch.uint8), qtype, cols)
    assert qtype == QuantType.Q8_0  # blocks of an fp16 scale and 32 int8 codes
    rng = np.random.default_rng(int(torch.randint(0, 2**31, (1,), generator=gen)))
    blocks = cols // 32
    scale = rng.uniform(0.001, 0.01, (rows, blocks, 1)).astype(np.float16).view(np.uint8)
    codes = rng.integers(-127, 128, (rows, blocks, 32), dtype=np.int8).view(np.uint8)
    data = np.concatenate((scale, codes), axis=-1).reshape(rows, blocks * 34)
    return QuantWeight(torch.from_numpy(np.ascontiguousarray(data)), qtype, cols)


def _weights(
    seed: int,
    *,
    hidden: int,
    heads: int,
    kv_heads: int,
    gamma: int,
    window: int,
    inter: int,
    layers: int,
    draft_vocab: int,
    vocab: int,
    rank: int,
    qtype: QuantType,
    remap: bool,
) -> tuple[DraftBlockWeights, DraftContextWeights]:
    gen = torch.Generator().manual_seed(seed)
    d = hidden // heads
    kv = kv_heads * d
    s = hidden**-0.5
    block_layers = tuple(
        DraftLayerWeights(
            input_norm=1 + 0.1 * torch.randn(hidden, generator=gen),
            qkv=_bf16(((heads + 2 * kv_heads) * d, hidden), gen, s),
            o=_bf16((hidden, heads * d), gen, s),
            post_norm=1 + 0.1 * torch.randn(hidden, generator=gen),
            gate_up=_bf16((2 * inter, hidden), gen, s),
            down=_bf16((hidden, inter), gen, inter**-0.5),
        )
        for _ in range(layers)
    )
    half = d // 2
    pos = torch.arange(-window, gamma, dtype=torch.float32)
    inv = 10000.0 ** (-torch.arange(half, dtype=torch.float32) * 2.0 / d)
    ang = pos[:, None] * inv[None]
    ids = torch.randperm(vocab, generator=gen)[:draft_vocab] if remap else None
    block = DraftBlockWeights(
        mask_embed=torch.randn(gamma - 1, hidden, generator=gen),
        layers=block_layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        eps=1e-5,
        rope_cos=ang.cos(),
        rope_sin=ang.sin(),
        head_norm=1 + 0.1 * torch.randn(hidden, generator=gen),
        head_eps=1e-6,
        head_rows=_head_rows(qtype, draft_vocab, hidden, gen),
        markov_in=torch.randn(vocab, rank, generator=gen),
        markov_out=_bf16((draft_vocab, rank), gen, rank**-0.5),
        vocab_ids=ids,
        conf_w=torch.randn(hidden + rank, generator=gen) * 0.1,
        conf_b=0.3,
    )
    feature = 2 * hidden
    context = DraftContextWeights(
        shift=torch.randn(feature, generator=gen),
        scale=torch.rand(feature, generator=gen) + 0.5,
        proj=_bf16((hidden, feature), gen, feature**-0.5),
        norm=1 + 0.1 * torch.randn(hidden, generator=gen),
        eps=1e-5,
        kv=_bf16((layers * 2 * kv, hidden), gen, s),
    )
    return block, context


def _kernel(block: DraftBlockWeights, context: DraftContextWeights) -> DSparkDraftKernel:
    kernel = DSparkDraftKernel(block, context)
    if not kernel.available():
        pytest.skip(f"compiled kernels unavailable: {kernel.error}")
    return kernel


def _check_tokens(block, hidden, anchors, tokens, ref_tokens) -> None:  # type: ignore[no-untyped-def]
    """Tokens equal the reference's, except past a near-tie the two summation orders may
    break differently: there the kernel's pick must be within rounding of the maximum."""
    head = dequantize(block.head_rows)
    for b in range(tokens.shape[0]):
        prev = int(anchors[b])
        for k in range(tokens.shape[1]):
            if int(tokens[b, k]) == int(ref_tokens[b, k]):
                prev = int(tokens[b, k])
                continue
            x = hidden[b, k]
            normed = x * torch.rsqrt(x.pow(2).mean() + block.head_eps) * block.head_norm
            logits = normed @ head.T + block.markov_in[prev] @ block.markov_out.T
            ids = block.vocab_ids
            pick = int(tokens[b, k])
            index = pick if ids is None else int((ids == pick).nonzero()[0, 0])
            assert float(logits.max() - logits[index]) <= 1e-4 * (1 + float(logits.abs().max()))
            break  # later positions follow another prefix


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    heads_kv=st.sampled_from([(2, 1), (4, 2), (3, 3), (6, 2)]),
    d=st.sampled_from([8, 16]),
    gamma=st.integers(2, 5),
    window=st.integers(1, 12),
    layers=st.integers(1, 2),
    qtype=st.sampled_from([QuantType.F32, QuantType.BF16, QuantType.Q8_0]),
    remap=st.booleans(),
    batch=st.integers(1, 3),
    data=st.data(),
)
def test_greedy_block_matches_reference(
    seed, heads_kv, d, gamma, window, layers, qtype, remap, batch, data
) -> None:  # type: ignore[no-untyped-def]
    heads, kv_heads = heads_kv
    hidden = heads * d
    if hidden % 32:  # the head rows' formats come in blocks of 32 columns
        hidden, d = 32 * heads, 32
    vocab = 97
    block, context = _weights(
        seed,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        gamma=gamma,
        window=12,
        inter=3 * hidden // 2 + 5,  # not a multiple of the 32-column panels
        layers=layers,
        draft_vocab=61,
        vocab=vocab,
        rank=data.draw(st.sampled_from([1, 7, 16])),
        qtype=qtype,
        remap=remap,
    )
    kernel = _kernel(block, context)
    gen = torch.Generator().manual_seed(seed + 1)
    entry = 2 * layers * kv_heads * d
    ctx = torch.randn(batch, window, entry, generator=gen)
    valid = torch.rand(batch, window, generator=gen) < 0.7
    valid = valid if data.draw(st.booleans()) else None
    anchors = torch.randint(0, vocab, (batch,), generator=gen)
    embed = torch.randn(batch, hidden, generator=gen)
    m = data.draw(st.integers(1, gamma))
    hidden_out = torch.empty(batch, m, hidden)
    tokens, conf = kernel.greedy(embed, anchors, ctx, valid, m, hidden_out=hidden_out)
    ref_tokens, ref_conf, ref_hidden = dspark_greedy_draft_reference(
        block, embed, anchors, ctx, valid, m
    )
    torch.testing.assert_close(hidden_out, ref_hidden[:, :m], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(conf, ref_conf, rtol=1e-5, atol=1e-5)
    _check_tokens(block, ref_hidden, anchors, tokens, ref_tokens)


def test_picks_map_through_the_draft_vocabulary() -> None:
    """Every draft is a token id of the draft vocabulary, the pick the reference makes."""
    block, context = _weights(
        3, hidden=32, heads=2, kv_heads=1, gamma=3, window=4, inter=40, layers=1,
        draft_vocab=40, vocab=50, rank=4, qtype=QuantType.F32, remap=True,
    )  # fmt: skip
    kernel = _kernel(block, context)
    ctx = torch.randn(1, 4, 2 * 16)
    embed = torch.randn(1, 32)
    hidden_out = torch.empty(1, 3, 32)  # all three positions drawn
    tokens, _ = kernel.greedy(embed, torch.tensor([7]), ctx, None, 3, hidden_out=hidden_out)
    ref, _, _ = dspark_greedy_draft_reference(block, embed, torch.tensor([7]), ctx, None, 3)
    assert block.vocab_ids is not None
    assert set(tokens[0].tolist()) <= set(block.vocab_ids.tolist())
    _check_tokens(block, hidden_out, torch.tensor([7]), tokens, ref)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**16), rows=st.integers(0, 7), layers=st.integers(1, 2))
def test_context_entries_match_reference(seed: int, rows: int, layers: int) -> None:
    block, context = _weights(
        seed, hidden=32, heads=4, kv_heads=2, gamma=3, window=8, inter=48, layers=layers,
        draft_vocab=32, vocab=40, rank=4, qtype=QuantType.F32, remap=False,
    )  # fmt: skip
    kernel = _kernel(block, context)
    features = torch.randn(rows, 64, generator=torch.Generator().manual_seed(seed)) * 5
    got = kernel.context_kv(features)
    torch.testing.assert_close(
        got, dspark_context_kv_reference(context, features), rtol=1e-4, atol=1e-4
    )


def test_bad_input_names_the_argument() -> None:
    block, context = _weights(
        0, hidden=32, heads=2, kv_heads=1, gamma=3, window=4, inter=40, layers=1,
        draft_vocab=16, vocab=20, rank=4, qtype=QuantType.F32, remap=False,
    )  # fmt: skip
    kernel = _kernel(block, context)
    ctx = torch.randn(1, 4, 32)
    embed = torch.randn(1, 32)
    with pytest.raises(ValueError, match="anchor_ids"):
        kernel.greedy(embed, torch.tensor([20]), ctx, None, 1)
    with pytest.raises(ValueError, match="num_tokens"):
        kernel.greedy(embed, torch.tensor([1]), ctx, None, 4)
    with pytest.raises(ValueError, match="context"):
        kernel.greedy(embed, torch.tensor([1]), torch.randn(1, 5, 32), None, 1)
    with pytest.raises(ValueError, match="valid"):
        kernel.greedy(embed, torch.tensor([1]), ctx, torch.ones(1, 3, dtype=torch.bool), 1)
    with pytest.raises(ValueError, match="features"):
        kernel.context_kv(torch.randn(2, 63))
    layer = block.layers[0]
    rounded = DraftLayerWeights(
        layer.input_norm, layer.qkv + 1e-3, layer.o, layer.post_norm, layer.gate_up, layer.down
    )
    with pytest.raises(ValueError, match=r"layers\[0\]\.qkv"):
        DSparkDraftKernel(
            DraftBlockWeights(**{**block.__dict__, "layers": (rounded,)}), context, enabled=False
        )


def test_the_op_runs_the_kernel_and_has_a_fake() -> None:
    block, context = _weights(
        5, hidden=64, heads=4, kv_heads=2, gamma=4, window=6, inter=70, layers=2,
        draft_vocab=48, vocab=60, rank=8, qtype=QuantType.Q8_0, remap=True,
    )  # fmt: skip
    kernel = _kernel(block, context)
    gen = torch.Generator().manual_seed(5)
    ctx = torch.randn(2, 5, 2 * 2 * 2 * 16, generator=gen)
    valid = torch.rand(2, 5, generator=gen) < 0.6
    embed, anchors = torch.randn(2, 64, generator=gen), torch.tensor([3, 59])
    weights, scalars = kernel.op_args()
    args = (embed, anchors, ctx, valid, 2, weights, scalars)
    tokens, conf = torch.ops.deepinfer.dspark_greedy_draft(*args)
    want_tokens, want_conf = kernel.greedy(embed, anchors, ctx, valid, 2)
    assert torch.equal(tokens, want_tokens)
    assert torch.equal(conf, want_conf)
    # Without a compiler the op unpacks its operands into the reference.
    ref_tokens, ref_conf = op_reference(*args)
    torch.testing.assert_close(ref_conf, conf, rtol=1e-5, atol=1e-5)
    _, _, ref_hidden = dspark_greedy_draft_reference(block, embed, anchors, ctx, valid, 2)
    _check_tokens(block, ref_hidden, anchors, tokens, ref_tokens)
    torch.library.opcheck(
        torch.ops.deepinfer.dspark_greedy_draft.default,
        args,
        test_utils=("test_schema", "test_faketensor"),
    )
