"""The lean runtime's many-row prefill (products on numpy's OpenBLAS sgemm, as the engine's
``quant_linear``): greedy tokens identical to the engine's and logits within 1e-4 on prompts
past 16 rows, and the same logits as the block-kernel path to fp32 rounding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from quant_helpers import quant_config, write_quant_gguf

from deepinfer import LLM, EngineConfig, SamplingParams
from deepinfer.lean import LeanLLM
from deepinfer_kernels.quant.blas_choice import BlasChoice, SingleThreadSgemm

CTX = 256
NEW = 6
TYPES = {
    "mixed": {"attn_q": "Q4_K", "attn_k": "Q5_K", "attn_v": "Q6_K", "attn_output": "Q4_1",
              "ffn_gate": "Q8_0", "ffn_up": "BF16", "ffn_down": "Q4_0", "token_embd": "Q4_1"},
    "q4_1-f16": {"attn_q": "Q4_1", "attn_k": "F16", "attn_v": "Q4_1", "attn_output": "F16",
                 "ffn_gate": "Q4_1", "ffn_up": "Q4_1", "ffn_down": "F16", "token_embd": "Q8_0"},
}  # fmt: skip


def _sgemm_or_skip() -> SingleThreadSgemm:
    try:
        found = BlasChoice.resolve("openblas").in_region_sgemm()
    except ValueError:
        found = None
    if found is None:
        pytest.skip("numpy's OpenBLAS (with an ILP64 cblas_sgemm) or threadpoolctl is missing")
    return found


@pytest.mark.parametrize("name", list(TYPES))
@pytest.mark.parametrize("length", [17, 70])
def test_many_row_prefill_matches_the_engine(
    name: str, length: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    sgemm = _sgemm_or_skip()
    folder = tmp_path_factory.mktemp(f"lean-prefill-{name}")
    path = write_quant_gguf(folder / "m.gguf", quant_config(max_position_embeddings=512),
                            TYPES[name], seed=5)  # fmt: skip
    models = tmp_path_factory.mktemp("models")
    ids = [int(i) for i in np.random.default_rng(length).integers(3, 60, size=length)]
    engine = LLM(str(path), enable_prefix_caching=False, cache_dir=models,
                 engine_config=EngineConfig(max_model_len=CTX, num_blocks=CTX // 16 + 2))  # fmt: skip
    lean = LeanLLM(path, max_model_len=CTX, cache_dir=models)
    try:
        seen: list[np.ndarray] = []

        def capture(_: tuple[int, ...], logits: torch.Tensor) -> torch.Tensor:
            seen.append(logits.detach().float().numpy().copy())
            return logits

        params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True,
                                logits_processors=[capture])  # fmt: skip
        want_ids = list(engine.generate([ids], params)[0].token_ids)
        model = lean.model
        assert model is not None
        model.sgemm = sgemm  # the engine's rule may keep MKL here (an Intel CPU): force it
        model.reset()
        logits, got_ids = model.prefill(ids), []
        for step, want in enumerate(seen):
            np.testing.assert_allclose(logits, want.reshape(-1), rtol=0, atol=1e-4,
                                       err_msg=f"step {step}")  # fmt: skip
            got_ids.append(int(np.argmax(logits)))
            logits = model.decode(got_ids[-1])
        assert got_ids == want_ids
        # Every prompt row's logits against the block kernels' path (no sgemm).
        model.reset()
        many = model.prefill(ids, all_logits=True)
        model.sgemm = None
        model.reset()
        blocks = model.prefill(ids, all_logits=True)
        # Two fp32 summation orders of the same products: apart by rounding relative to size.
        np.testing.assert_allclose(many, blocks, rtol=1e-4, atol=1e-4)
        assert not np.array_equal(many, blocks)  # the sgemm path did run (another sum order)
    finally:
        engine.close()
        lean.close()


def test_sgemm_argument_is_checked() -> None:
    from deepinfer.lean.model import LeanModel

    with pytest.raises(ValueError, match="sgemm"):
        LeanModel(None, 16, sgemm="openblas")  # type: ignore[arg-type]
