"""Qwen2, Qwen3, Mistral and DeepSeek-V3/V2 checkpoints written by transformers run exactly.

Each family's tiny random model is saved by transformers' own class (``save_pretrained``) with
a ``tokenizers``-built tokenizer; the engine loads the directory like a downloaded model. In
fp32: logits within 1e-4 of transformers' on the dense and the paged path, greedy output
token-identical to ``generate`` for 10 prompts x 32 tokens under continuous batching (fewer
slots than requests, chunked prefill), prefix-cache hits after a restart, and DSpark with an
untrained drafter staying lossless.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from family_helpers import build_checkpoint, hf_greedy, prompts
from hypothesis import given, settings
from hypothesis import strategies as st
from model_helpers import one_thread

from deepinfer import LLM, EngineConfig, LLMEngine, SamplingParams
from deepinfer.engine.cache_setup import PrefixCacheConfig
from deepinfer.models import AttentionMetadata, KVPool, LlamaConfig, LoadedModel, load_model
from deepinfer.models.deepseek import DeepseekModel
from deepinfer.models.deepseek_config import DeepseekConfig
from deepinfer.models.families import config_from_hf
from deepinfer.models.kv_pool import blocks_for_memory
from deepinfer.models.qwen import Qwen3Model
from deepinfer.models.rope import inverse_frequencies
from deepinfer.models.spec_adapter import LlamaTargetAdapter
from deepinfer.pd.transport import export_pages, import_pages
from deepinfer.speculative import DSparkSpeculator
from deepinfer_spec import DSparkConfig, DSparkDrafter, FixedGammaScheduler

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("model_families")]

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)

FAMILIES = ["qwen2", "qwen3", "mistral", "deepseek_v3", "deepseek_v2"]
MAX_NEW = 32
# Fewer slots than the 10 requests and a small token budget: requests join as others finish
# and long prompts prefill in chunks next to running decodes.
CFG = EngineConfig(block_size=8, num_blocks=160, max_num_seqs=4, max_batched_tokens=24)
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """``(name, checkpoint dir, transformers model, deepinfer LoadedModel)``."""
    out = tmp_path_factory.mktemp(request.param)
    hf = build_checkpoint(request.param, out, seed=FAMILIES.index(request.param))
    return request.param, out, hf, load_model(out)


@pytest.fixture(scope="module")
def reference(family) -> tuple[list[list[int]], list[list[int]]]:
    """10 prompts and transformers' greedy continuations of each."""
    _, _, hf, loaded = family
    ps = prompts(loaded.config.vocab_size)
    return ps, hf_greedy(hf, ps, MAX_NEW)


def test_tokenizer_and_chat_template_come_from_the_directory(family) -> None:
    _, _, _, loaded = family
    tok = loaded.tokenizer
    assert [tok.id_to_token(i) for i in tok.eos_token_ids] == ["<|im_end|>"]
    text = loaded.chat_template.render([{"role": "user", "content": "the cat"}])
    assert text == "<|im_start|>user\nthe cat<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(text)
    assert ids[0] == tok.backend.token_to_id("<|im_start|>")
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_config_names_the_family_features(family) -> None:
    name, _, hf, loaded = family
    cfg = loaded.config
    if name.startswith("deepseek"):
        _check_deepseek(name, hf, loaded)
        return
    assert cfg.model_type == name
    assert cfg.attention_bias == (name == "qwen2")
    assert cfg.qk_norm == (name == "qwen3")
    assert isinstance(loaded.model, Qwen3Model) == (name == "qwen3")
    window = hf.config.sliding_window if name == "mistral" else None
    assert cfg.layer_windows == ((window,) * cfg.num_layers if window else ())
    assert cfg.rope_theta == hf.config.rope_parameters["rope_theta"]
    assert cfg.tie_word_embeddings == hf.config.tie_word_embeddings


def _check_deepseek(name: str, hf: torch.nn.Module, loaded: LoadedModel) -> None:
    cfg = loaded.config
    assert isinstance(cfg, DeepseekConfig) and isinstance(loaded.model, DeepseekModel)
    assert cfg.model_type == name
    assert [cfg.is_moe_layer(i) for i in range(cfg.num_layers)] == [False, True, True]
    assert cfg.scoring_func == ("sigmoid" if name == "deepseek_v3" else "softmax")
    # The pool holds one latent per token and layer: kv_lora_rank + qk_rope_head_dim values,
    # not 2 x heads x head_dim.
    pool = KVPool.for_weights(loaded.model, num_blocks=2, block_size=8)
    assert pool.page_layout == (1, 1, 32 + 8)
    assert pool.bytes_per_block == cfg.num_layers * 8 * 40 * 4
    # LLM(kv_memory=...) sizes the pool from the same latent layout.
    assert blocks_for_memory(cfg, 3 * pool.bytes_per_block, 8) == 3
    if name == "deepseek_v3":
        assert cfg.rope_scaling is not None and cfg.rope_scaling.rope_type == "yarn"
        assert cfg.softmax_scale == pytest.approx(24**-0.5 * (0.1 * math.log(4.0) + 1) ** 2)
        hf_inv = hf.model.rotary_emb.inv_freq
        torch.testing.assert_close(loaded.model.rope.inv_freq, hf_inv, atol=0, rtol=1e-6)


def _paged_logits(loaded: LoadedModel, ids: list[int], split: int) -> torch.Tensor:
    """Logits of every position: ``ids[:split]`` prefilled, then the rest one chunk later
    (its queries read the first part from the pool)."""
    model, block = loaded.model, 8
    pool = KVPool.for_weights(model, -(-len(ids) // block), block)
    table = pool.allocate(pool.num_blocks)
    rows = []
    with torch.inference_mode():
        for start, end in ((0, split), (split, len(ids))):
            attn = AttentionMetadata.build([table], [end], [end - start], block)
            hidden = model(torch.tensor(ids[start:end]), attn.positions(), attn, pool)
            rows.append(model.compute_logits(hidden))
    return torch.cat(rows)


def test_logits_match_transformers(family, reference) -> None:
    _, _, hf, loaded = family
    ps, outs = reference
    ids = ps[3] + outs[3]  # 22 prompt + 32 generated tokens: past Mistral's 12-token window
    with torch.inference_mode():
        ref = hf(torch.tensor([ids])).logits[0].float()
        dense = loaded.model.compute_logits(loaded.model.forward_dense(torch.tensor([ids]))[0])[0]
    torch.testing.assert_close(dense, ref, atol=1e-4, rtol=0)
    torch.testing.assert_close(_paged_logits(loaded, ids, 13), ref, atol=1e-4, rtol=0)
    # The greedy check below is meaningful only away from near-ties.
    top2 = ref.topk(2, dim=-1).values
    assert float((top2[:, 0] - top2[:, 1]).min()) > 1e-3


def test_greedy_matches_transformers_generate_under_continuous_batching(family, reference) -> None:
    _, _, _, loaded = family
    ps, expected = reference
    llm = LLM(loaded, engine_config=CFG, enable_prefix_caching=False)
    outs = llm.generate(ps, GREEDY)
    assert [o.token_ids for o in outs] == expected
    # The batch really was continuous: more requests than slots.
    assert len(ps) > CFG.max_num_seqs


def test_prefix_cache_hits_after_a_restart(family, reference, tmp_path: Path) -> None:
    _, _, _, loaded = family
    ps, expected = reference
    second = ps[4]  # 29 tokens: 3 full blocks of 8
    first = [*second[:24], 5, 6, 7]  # shares those 3 blocks, then differs
    cache = PrefixCacheConfig(
        device_blocks=0, host_bytes=0, disk_bytes=1 << 22, directory=str(tmp_path / "kv")
    )
    with LLM(loaded, engine_config=CFG, prefix_cache_config=cache) as writer:
        seed = writer.generate([first], SamplingParams(temperature=0.0, max_tokens=2))[0]
    # A new engine over the same directory: the only copy of the prefix is on disk.
    with LLM(loaded, engine_config=CFG, prefix_cache_config=cache) as restarted:
        hit = restarted.generate([second], GREEDY)[0]
        assert restarted.store is not None
        disk = restarted.store.stats().tiers[0]
    assert seed.metrics is not None and seed.metrics.num_cached_tokens == 0
    assert hit.metrics is not None and hit.metrics.num_cached_tokens == 24
    assert disk.hit_blocks == 3 and disk.bytes_read > 0
    assert hit.token_ids == expected[4]  # transformers' own continuation of the prompt


def test_dspark_with_an_untrained_drafter_is_lossless(family, reference) -> None:
    _, _, _, loaded = family
    ps, expected = reference
    model = loaded.model
    target = LlamaTargetAdapter(model, KVPool.for_weights(model, num_blocks=4, block_size=4))
    torch.manual_seed(1)
    drafter = DSparkDrafter(DSparkConfig(target_layer_ids=(0, 1), gamma=3, window=8), target)
    spec = DSparkSpeculator(drafter.eval(), FixedGammaScheduler(3), max_seqs=CFG.max_num_seqs)
    engine = LLMEngine(model, None, CFG, speculator=spec)
    ids = [engine.add_request(p, GREEDY) for p in ps[:4]]
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    assert [done[i].token_ids for i in ids] == expected[:4]
    assert sum(done[i].metrics.num_spec_steps for i in ids) > 0


def test_latent_pages_travel_through_pd_export_and_import(family) -> None:
    """PD moves pages along the pool's block dimension: an MLA pool's latent pages too."""
    name, _, _, loaded = family
    model = loaded.model
    src = KVPool.for_weights(model, num_blocks=6, block_size=8)
    ids = list(range(3, 23))
    blocks = src.allocate(3)
    attn = AttentionMetadata.build([blocks], [len(ids)], [len(ids)], 8)
    with torch.inference_mode():
        model(torch.tensor(ids), attn.positions(), attn, src)
    dst = KVPool.for_weights(model, num_blocks=6, block_size=8)
    landing = dst.allocate(5)[2:]
    import_pages(dst, export_pages(src, blocks), landing)
    assert torch.equal(dst.tensor[:, :, landing], src.tensor[:, :, blocks])
    if name.startswith("deepseek"):
        assert src.latent_cache(0)[blocks[0], 0].abs().sum() > 0
        with pytest.raises(ValueError, match="latent_cache"):
            KVPool(2, 4, 8, 2, 16).latent_cache(0)


def test_config_json_round_trips(family) -> None:
    _, out, _, loaded = family
    cfg = loaded.config
    assert type(cfg).from_hf_config(cfg.to_hf_config()) == cfg
    raw = json.loads((out / "config.json").read_text())
    assert config_from_hf(raw) == cfg


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"moe_layer_freq": 2}, "moe_layer_freq = 2"),
        ({"topk_method": "greedy"}, "topk_method 'greedy'"),
        ({"scoring_func": "relu"}, "scoring_func 'relu'"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_type 'linear'"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"quantization_config": {"quant_method": "fp8"}}, "quantization_config (fp8)"),
        ({"architectures": ["DeepseekV2ForCausalLM"]}, "'DeepseekV2ForCausalLM'"),
    ],
)
def test_unsupported_deepseek_settings_are_refused_by_name(
    changes: dict[str, object], needle: str
) -> None:
    base = {
        "model_type": "deepseek_v3",
        "architectures": ["DeepseekV3ForCausalLM"],
        "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 2, "kv_lora_rank": 16, "q_lora_rank": None,
        "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8, "n_routed_experts": 4,
        "num_experts_per_tok": 2, "moe_intermediate_size": 16,
    }  # fmt: skip
    assert isinstance(config_from_hf(base), DeepseekConfig)
    with pytest.raises(ValueError, match="not supported") as info:
        config_from_hf({**base, **changes})
    assert needle in str(info.value)


def test_yarn_rope_on_a_llama_family_model_matches_transformers(tmp_path: Path) -> None:
    """YaRN without DeepSeek's mscale pair (Qwen's long-context setting): frequencies ramp
    between the beta corrections and cos/sin carry 0.1 ln(factor) + 1."""
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    hf = build_checkpoint("qwen2", tmp_path, seed=7, rope_scaling=scaling)
    loaded = load_model(tmp_path)
    assert loaded.config.rope_scaling is not None
    assert loaded.model.rope.attention_factor == pytest.approx(0.1 * math.log(4.0) + 1)
    ids = list(range(3, 43))  # past the original 16 positions
    with torch.inference_mode():
        ref = hf(torch.tensor([ids])).logits[0].float()
        ours = loaded.model.compute_logits(loaded.model.forward_dense(torch.tensor([ids]))[0])
    torch.testing.assert_close(ours[0], ref, atol=1e-4, rtol=0)
    torch.testing.assert_close(_paged_logits(loaded, ids, 17), ref, atol=1e-4, rtol=0)


def test_a_block_id_outside_the_pool_is_refused(family) -> None:
    _, _, _, loaded = family
    pool = KVPool.for_weights(loaded.model, num_blocks=2, block_size=8)
    attn = AttentionMetadata.build([[5]], [3], [3], 8)  # block 5 of a 2-block pool
    with pytest.raises(ValueError, match="slot_mapping"), torch.inference_mode():
        loaded.model(torch.tensor([3, 4, 5]), attn.positions(), attn, pool)


@settings(max_examples=20, deadline=None)
@given(
    head_dim=st.sampled_from([8, 16, 64, 128]),
    theta=st.sampled_from([10000.0, 500000.0, 1e6]),
    factor=st.floats(1.0, 40.0),
    original=st.sampled_from([16, 64, 4096]),
    betas=st.tuples(st.floats(1.0, 64.0), st.floats(0.25, 4.0)),
    mscales=st.sampled_from([(0.0, 0.0), (1.0, 1.0), (0.707, 1.0), (1.0, 0.0)]),
    truncate=st.booleans(),
)
def test_yarn_frequencies_and_attention_factor_equal_transformers(
    head_dim: int,
    theta: float,
    factor: float,
    original: int,
    betas: tuple[float, float],
    mscales: tuple[float, float],
    truncate: bool,
) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    beta_fast, beta_slow = max(betas), min(betas)
    raw = {
        "rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original,
        "beta_fast": beta_fast, "beta_slow": beta_slow, "truncate": truncate,
        **({"mscale": mscales[0], "mscale_all_dim": mscales[1]} if mscales[0] else {}),
    }  # fmt: skip
    hf_cfg = transformers.LlamaConfig(
        hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim,
        max_position_embeddings=int(original * factor) + 1,
        rope_parameters={**raw, "rope_theta": theta},
    )  # fmt: skip
    hf_inv, hf_factor = ROPE_INIT_FUNCTIONS["yarn"](hf_cfg)
    scaling = LlamaConfig(
        vocab_size=8, hidden_size=head_dim * 2, intermediate_size=8, num_layers=1, num_heads=2,
        num_kv_heads=2, head_dim=head_dim, rope_theta=theta, rope_scaling=raw,
    ).rope_scaling  # fmt: skip
    assert scaling is not None
    torch.testing.assert_close(
        inverse_frequencies(head_dim, theta, scaling), hf_inv, rtol=1e-6, atol=0
    )
    assert scaling.attention_factor == pytest.approx(hf_factor, rel=1e-12)
