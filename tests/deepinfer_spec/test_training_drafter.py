"""Drafter training: the loss definition, training progress, checkpoints, resume, the CLI."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import make_drafter
from safetensors.torch import load_file, save_file

from deepinfer_spec import DSparkConfig, DSparkDrafter, RecomputeTarget
from deepinfer_spec.cli import main
from deepinfer_spec.testing import TinyTarget
from deepinfer_spec.training import (
    LossWeights,
    TrainConfig,
    dspark_loss,
    evaluate,
    load_drafter,
    position_weights,
    read_jsonl,
    sample_from_target,
    save_drafter,
    train_drafter,
)
from deepinfer_spec.training.loss import sample_anchors


def test_loss_matches_its_definition_on_one_block(tiny_model: TinyTarget) -> None:
    target = RecomputeTarget(tiny_model)
    d = make_drafter(target)  # gamma 4, window 8
    ids = torch.randint(0, 32, (2, 14), generator=torch.Generator().manual_seed(0))
    out = tiny_model.score(ids, [0, 1])
    rows, anchors = torch.tensor([1]), torch.tensor([9])
    terms = dspark_loss(d, ids, out, rows, anchors)
    # By hand: context = positions 1..8 of row 1, anchor x_9, labels x_10..x_13.
    ctx = d.project_context(out.features[1:2, 1:9])
    h = d.backbone(ids[1:2, 9], ctx, torch.ones(1, 8, dtype=torch.bool))
    logits, conf = d.teacher_forced(h, ids[1:2, 9:13])
    p_d = torch.softmax(logits, -1)[0]
    p_t = torch.softmax(out.logits[1, 9:13], -1)
    ce = -torch.log(p_d[torch.arange(4), ids[1, 10:14]])
    tv = 0.5 * (p_d - p_t).abs().sum(-1)
    bce = F.binary_cross_entropy_with_logits(conf[0], 1 - tv, reduction="none")
    w = torch.exp(-torch.arange(4.0) / 4)
    total = ((0.1 * ce + 0.9 * tv + bce) * w).sum() / w.sum()
    torch.testing.assert_close(terms.total, total, rtol=1e-5, atol=1e-6)
    assert math.isclose(terms.tv, float((tv * w).sum().detach() / w.sum()), rel_tol=1e-5)
    assert math.isclose(terms.acceptance, float((1 - tv).mean().detach()), rel_tol=1e-5)
    torch.testing.assert_close(position_weights(4), w)
    # The loss reaches the drafter's heads but never the frozen target.
    terms.total.backward()
    assert d.markov_out.weight.grad is not None and d.confidence_head.weight.grad is not None
    assert all(p.grad is None for p in tiny_model.parameters())


@pytest.mark.parametrize("shortlist", [None, [3, 9, 0, 17, 30, 12, 5, 21]])
def test_distill_term_is_the_soft_label_cross_entropy(
    tiny_model: TinyTarget, shortlist: list[int] | None
) -> None:
    target = RecomputeTarget(tiny_model)
    d = make_drafter(target)
    if shortlist is not None:
        d = d.restrict_vocab(shortlist)
    ids = torch.randint(0, 32, (1, 14), generator=torch.Generator().manual_seed(2))
    out = tiny_model.score(ids, [0, 1])
    only = LossWeights(ce=0.0, tv=0.0, bce=0.0, distill=1.0)
    terms = dspark_loss(d, ids, out, torch.tensor([0]), torch.tensor([9]), only)
    h = d.backbone(ids[:, 9], d.project_context(out.features[:, 1:9]), torch.ones(1, 8).bool())
    log_pd = torch.log_softmax(d.teacher_forced(h, ids[:, 9:13])[0][0], -1)
    p_t = torch.softmax(out.logits[0, 9:13], -1)
    if shortlist is not None:
        p_t = p_t[:, shortlist]
    w = torch.exp(-torch.arange(4.0) / 4)
    expect = (-(p_t * log_pd).sum(-1) * w).sum() / w.sum()
    torch.testing.assert_close(terms.total, expect, rtol=1e-5, atol=1e-6)
    assert math.isclose(terms.distill, float(expect.detach()), rel_tol=1e-5)
    # Off by default (the paper's recipe): the default total does not include it.
    default = dspark_loss(d, ids, out, torch.tensor([0]), torch.tensor([9]))
    recomputed = 0.1 * default.ce + 0.9 * default.tv + 1.0 * default.bce
    assert math.isclose(float(default.total.detach()), recomputed, rel_tol=1e-5)


def test_anchor_sampling_respects_lengths() -> None:
    gen = torch.Generator().manual_seed(0)
    rows, anchors = sample_anchors(torch.tensor([10, 3, 6]), 4, 50, gen)
    assert set(rows.tolist()) == {0, 2}  # the 3-token sequence cannot hold a block
    lens = torch.tensor([10, 3, 6])[rows]
    assert bool((anchors >= 0).all()) and bool((anchors + 4 <= lens - 1).all())
    assert int(anchors[rows == 0].max()) == 5  # the last legal anchor does get drawn
    with pytest.raises(ValueError, match="longer than gamma"):
        sample_anchors(torch.tensor([4, 2]), 4, 1, gen)


def test_bad_training_arguments_raise(tiny_model: TinyTarget, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="steps"):
        TrainConfig(steps=0)
    with pytest.raises(ValueError, match="lr"):
        TrainConfig(lr=float("nan"))
    with pytest.raises(ValueError, match="weight"):
        LossWeights(ce=-1.0)
    cfg = DSparkConfig(target_layer_ids=(0,), gamma=2, window=4, markov_rank=4)
    with pytest.raises(ValueError, match="exactly one"):
        train_drafter(tiny_model, [[1, 2, 3]], None, TrainConfig())
    with pytest.raises(ValueError, match="token ids"):
        train_drafter(tiny_model, [[1, 2, 99, 4]], cfg, TrainConfig(steps=1, progress=False))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('[1, 2, 3]\n{"ids": [1, "x"]}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        read_jsonl(bad)
    with pytest.raises(ValueError, match="checkpoint metadata"):
        load_drafter(tmp_path, tiny_model)


@pytest.mark.slow
def test_training_lowers_tv_and_raises_measured_acceptance() -> None:
    model = TinyTarget(vocab_size=32, hidden_size=32, num_layers=2, seed=0)
    gen = torch.Generator().manual_seed(0)
    data = sample_from_target(model, 64, 32, generator=gen)
    held_out = sample_from_target(model, 8, 24, generator=gen)
    prompts = [s[:8] for s in held_out]
    cfg = DSparkConfig(
        target_layer_ids=(0, 1), gamma=4, window=16, num_layers=1, markov_rank=32, num_heads=4
    )
    torch.manual_seed(0)
    drafter = DSparkDrafter(cfg, model)
    ids = torch.tensor(held_out)
    out = model.score(ids, [0, 1])
    rows, anchors = sample_anchors(torch.full((8,), 24), 4, 8, torch.Generator().manual_seed(3))

    def held_out_tv() -> float:
        with torch.no_grad():
            return dspark_loss(drafter, ids, out, rows, anchors).tv

    tv_before = held_out_tv()
    before = evaluate(drafter, model, prompts, max_new_tokens=12, seed=1)
    result = train_drafter(
        model,
        data,
        None,
        TrainConfig(steps=200, batch_size=8, anchors_per_sequence=8, lr=3e-3, progress=False),
        drafter=drafter,
    )
    assert result.step == 200 and len(result.history) == 20
    assert result.history[-1]["tv"] < 0.75 * result.history[0]["tv"]
    tv_after = held_out_tv()
    assert tv_after < 0.8 * tv_before
    after = evaluate(drafter, model, prompts, max_new_tokens=12, seed=1)
    assert after.tau > before.tau + 0.3
    assert after.acceptance[0] > before.acceptance[0]
    assert 1.0 <= after.tau <= 5.0 and len(after.temperatures) == 4
    # tau = 1 + E[accepted] = 1 + sum_k prod_{i<=k} P(accept i | accepted < i), empirically exact.
    for rep in (before, after):
        survival = torch.cumprod(torch.tensor(rep.acceptance, dtype=torch.float64), 0)
        assert math.isclose(rep.tau, 1.0 + float(survival.sum()), rel_tol=1e-9)


def test_checkpoint_round_trip_and_resume(tiny_model: TinyTarget, tmp_path: Path) -> None:
    data = torch.randint(0, 32, (16, 12), generator=torch.Generator().manual_seed(0))
    cfg = DSparkConfig(
        target_layer_ids=(1,),
        gamma=3,
        window=4,
        markov_rank=8,
        sequential_head="rnn",
        num_heads=4,
        intermediate_size=64,
    )
    out = tmp_path / "ckpt"
    first = train_drafter(
        tiny_model,
        list(data),
        cfg,
        TrainConfig(
            steps=4,
            batch_size=4,
            progress=False,
            out_dir=str(out),
            log_every=2,
            init_from_target_layers=(0,),
        ),
    )
    meta = json.loads((out / "config.json").read_text())
    assert meta["dspark"]["sequential_head"] == "rnn" and meta["vocab_size"] == 32
    assert json.loads((out / "trainer_state.json").read_text())["step"] == 4
    loaded = load_drafter(out, tiny_model)
    for (name, a), (_, b) in zip(first.drafter.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    resumed = train_drafter(
        tiny_model,
        list(data),
        None,
        TrainConfig(steps=6, batch_size=4, progress=False, out_dir=str(out), log_every=2),
        resume_from=out,
    )
    assert resumed.step == 6 and [h["step"] for h in resumed.history] == [2.0, 4.0, 6.0]
    assert not torch.equal(resumed.drafter.markov_out.weight, loaded.markov_out.weight)
    other = TinyTarget(vocab_size=16)
    with pytest.raises(ValueError, match="hidden/vocab"):
        load_drafter(out, other)
    save_drafter(loaded, tmp_path / "plain")
    assert sorted(p.name for p in (tmp_path / "plain").iterdir()) == [
        "config.json",
        "drafter.safetensors",
    ]


def test_fresh_training_fits_feature_stats_and_old_checkpoints_still_load(
    tiny_model: TinyTarget, tmp_path: Path
) -> None:
    data = torch.randint(0, 32, (8, 12), generator=torch.Generator().manual_seed(0))
    cfg = DSparkConfig(target_layer_ids=(0, 1), gamma=3, window=4, markov_rank=8, num_heads=4)
    train = TrainConfig(steps=1, batch_size=4, progress=False, out_dir=str(tmp_path / "new"))
    fitted = train_drafter(tiny_model, list(data), cfg, train).drafter
    features = tiny_model.score(data[:4], [0, 1]).features[:, 1:]  # the first batch, sink dropped
    torch.testing.assert_close(fitted.feature_shift, features.reshape(-1, 64).mean(0))
    assert torch.equal(
        load_drafter(tmp_path / "new", tiny_model).feature_scale, fitted.feature_scale
    )
    plain = train_drafter(
        tiny_model,
        list(data),
        cfg,
        dataclasses.replace(train, standardize_features=False, out_dir=None),
    ).drafter
    assert torch.equal(plain.feature_scale, torch.ones(64))
    # A checkpoint from before the statistics existed loads with the identity; any other
    # missing or unknown weight is still refused.
    old = tmp_path / "old"
    save_drafter(fitted, old)
    state = load_file(str(old / "drafter.safetensors"))
    save_file(
        {k: v for k, v in state.items() if not k.startswith("feature_")},
        str(old / "drafter.safetensors"),
    )
    legacy = load_drafter(old, tiny_model)
    assert torch.equal(legacy.feature_shift, torch.zeros(64))
    torch.testing.assert_close(legacy.context_proj.weight, fitted.context_proj.weight)
    del state["markov_out.weight"]
    save_file(state, str(old / "drafter.safetensors"))
    with pytest.raises(ValueError, match=r"markov_out\.weight"):
        load_drafter(old, tiny_model)


def test_cli_trains_resumes_and_evaluates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "drafter"
    target_kwargs = json.dumps({"vocab_size": 32, "hidden_size": 32, "seed": 1})
    common = [
        "--target", "spec_tiny_target:make_target", "--target-kwargs", target_kwargs,
        "--synthetic", "12", "--seq-len", "12", "--eval-prompts", "3", "--prompt-len", "4",
        "--max-new-tokens", "6",
    ]  # fmt: skip
    args = ["train", *common, "--out", str(out), "--steps", "3", "--gamma", "3", "--window", "4"]
    args += ["--markov-rank", "8", "--no-progress", "--target-layers", "1"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "step 3" in text and "tau" in text and "acceptance by position" in text
    assert (out / "drafter.safetensors").exists()
    resume = ["train", *common, "--out", str(out), "--resume", "--steps", "5", "--no-progress"]
    assert main([*resume, "--no-eval"]) == 0
    assert json.loads((out / "trainer_state.json").read_text())["step"] == 5
    assert main(["eval", *common, "--checkpoint", str(out)]) == 0
    assert "survival ECE" in capsys.readouterr().out
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps(list(range(i, i + 10))) for i in range(8)))
    assert main(["eval", *common[:4], "--data", str(data), "--checkpoint", str(out)]) == 0
    capsys.readouterr()
    # A bad --target is a usage error: one line on stderr, exit code 2, no traceback.
    assert main(["eval", "--target", "nocolon", "--checkpoint", str(out)]) == 2
    assert "module:function" in capsys.readouterr().err
