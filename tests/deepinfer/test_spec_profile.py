"""`deepinfer.speculative.profile_target_sps` (`deepinfer_spec.profile_target` over the model's
target adapter) after the engine has run: the engine's forwards run in inference mode, and the
profile must run in it too (a buffer the model made there cannot be updated outside it; without
it this test fails with "Inplace update to inference tensor outside InferenceMode")."""

from __future__ import annotations

import torch
from model_helpers import random_hf_state, tiny_config

from deepinfer.engine.config import EngineConfig
from deepinfer.engine.engine import LLMEngine
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.models import KVPool, build_model
from deepinfer.speculative import profile_target_sps


def test_profile_after_engine_steps_and_engine_steps_after_a_profile() -> None:
    cfg = tiny_config(max_position_embeddings=256)
    # bf16-exact weights: the forwards take the compiled fused-layer path (where a C compiler
    # is present), whose step buffers are made by the first forward that runs.
    state = {k: v.to(torch.bfloat16).float() for k, v in random_hf_state(cfg, seed=5).items()}
    model = build_model(cfg, state)
    config = EngineConfig(block_size=4, num_blocks=64, max_num_seqs=4, max_batched_tokens=16)
    pool = KVPool.for_model(model.config, config.num_blocks, config.block_size)
    engine = LLMEngine(model, None, config, pool=pool)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)

    def generate() -> list[int]:
        engine.add_request([5, 6, 7, 8, 9], params)
        out = []
        while engine.has_unfinished():
            out = [o for o in engine.step() if o.finished] or out
        return list(out[0].token_ids)

    first = generate()
    free = pool.num_free_blocks
    curve = profile_target_sps(model, pool, (1, 2, 4), context=8, repeats=1, warmup=0)
    assert curve.batch_sizes == (1, 2, 4) and all(s > 0 for s in curve.steps_per_second)
    assert pool.num_free_blocks == free  # the scratch history is released
    assert generate() == first  # the profile's scratch KV disturbs no later request
    assert not torch.is_inference_mode_enabled()
