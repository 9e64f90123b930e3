"""The engine's drafter on the compiled greedy block: wired in, same drafts, lossless."""

from __future__ import annotations

import pytest
import torch

from deepinfer import LLM, EngineConfig, SamplingParams, SpeculativeConfig
from deepinfer.models import LoadedModel, default_model_path, load_model
from deepinfer.speculative import SHIPPED_DRAFTER
from deepinfer_kernels.cpu.native import compiler_available
from deepinfer_spec import propose

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def smol() -> LoadedModel:
    try:
        default_model_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    if not (SHIPPED_DRAFTER / "config.json").exists():
        pytest.skip("no shipped drafter checkpoint")
    if not compiler_available():
        pytest.skip("no C compiler")
    return load_model()


def test_engine_drafts_through_the_compiled_block(smol: LoadedModel) -> None:
    cfg = EngineConfig(num_blocks=128, max_num_seqs=4)
    forced = SpeculativeConfig("dspark", num_speculative_tokens=2, draft_gate=False)
    spec = LLM(smol, engine_config=cfg, enable_prefix_caching=False, speculative=forced)
    speculator = spec.engine.speculator
    assert speculator is not None
    drafter = speculator.drafter  # type: ignore[attr-defined]
    native = drafter.native
    assert native is not None  # the shipped bf16 drafter on a CPU model
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompt = "def add(a, b):\n    return"
    plain = LLM(smol, engine_config=cfg, enable_prefix_caching=False)
    assert [o.token_ids for o in spec.generate([prompt], params)] == [
        o.token_ids for o in plain.generate([prompt], params)
    ]
    # Real context entries of the target's features: the compiled block drafts the modules'
    # tokens, with their confidences.
    ids = smol.tokenizer.encode(prompt)
    out = speculator.spec.context  # type: ignore[attr-defined]
    out.catch_up("probe", 0)
    with torch.inference_mode():
        features = torch.cat(
            smol.model.forward_dense(torch.tensor([ids]), list(drafter.config.target_layer_ids))[1],
            dim=-1,
        )[0]
    out.push("probe", features)
    context, valid = out.view(["probe"])
    anchor = torch.tensor([ids[-1]])
    got = propose(drafter, anchor, context, valid, temperature=0.0, context_is_kv=True)
    drafter.use_native(None)
    try:
        ref = propose(drafter, anchor, context, valid, temperature=0.0, context_is_kv=True)
        ref_entries = drafter.context_kv(drafter.project_context(features))
    finally:
        drafter.use_native(native)
    assert torch.equal(got.token_ids, ref.token_ids)
    torch.testing.assert_close(got.confidence, ref.confidence, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(native.context_kv(features), ref_entries, rtol=1e-4, atol=1e-4)
