"""Every CLI fails with one line on stderr and a non-zero code (2 for usage), never a traceback."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from model_helpers import random_hf_state, tiny_config, write_tiny_gguf

from deepinfer.cli import main
from deepinfer_cache.cli import main as cache_main
from deepinfer_sched.cli import main as sched_main
from deepinfer_spec.cli import main as spec_main


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = tiny_config(max_position_embeddings=512)
    path = tmp_path_factory.mktemp("cli-errors") / "tiny.gguf"
    return write_tiny_gguf(path, cfg, random_hf_state(cfg, seed=5))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # One per module: a fresh cache directory also means compiling the CPU kernels again.
    return tmp_path_factory.mktemp("cli-errors-cache")


@pytest.fixture(autouse=True)
def private_cache(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPINFER_CACHE_DIR", str(cache_dir))
    monkeypatch.delenv("DEEPINFER_TRACEBACK", raising=False)


def _exit_code(entry: Callable[[list[str]], int], argv: list[str]) -> int:
    try:
        return entry(argv)
    except SystemExit as exc:  # argparse exits for usage errors and --version
        return int(exc.code or 0)


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["generate", "hi", "--temperature", "-1"], "temperature"),
        (["generate", "hi", "--temperature", "nan"], "temperature"),
        (["generate", "hi", "--temperature", "warm"], "--temperature"),
        (["generate", "hi", "--max-tokens", "0"], "--max-tokens"),
        (["generate", "hi", "--top-p", "0"], "top_p"),
        (["generate", "hi", "--model", "/no/such/model.gguf"], "--model"),
        (["generate", "hi", "--device", "tpu"], "--device"),
        (["bench", "--num-prompts", "0"], "--num-prompts"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_deepinfer_usage_errors_are_one_line_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _exit_code(main, argv) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("deepinfer") and "error:" in line and needle in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_device_without_cuda_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_code(main, ["generate", "hi", "--device", "cuda"]) == 2
    assert "CUDA is not available" in _one_line(capsys.readouterr().err)


def test_a_model_that_does_not_load_is_one_line_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bogus = tmp_path / "broken.gguf"
    bogus.write_bytes(b"GGUF but not really")
    assert _exit_code(main, ["generate", "hi", "--model", str(bogus)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("deepinfer generate: error:")


def test_unwritable_output_directory_is_one_line_exit_1(
    gguf_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")  # a file where a directory must go: fails for root as well
    argv = ["demo", "--out", str(blocker / "out"), "--model", str(gguf_path)]
    argv += ["--conversations", "1", "--turns", "1", "--max-tokens", "2", "--no-speculative"]
    assert _exit_code(main, argv) == 1
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("deepinfer demo: error:") and "a-file" in line


def test_unwritable_cache_dir_warns_and_still_generates(
    gguf_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    argv = ["generate", "the cat", "--model", str(gguf_path), "--max-tokens", "2", "--json"]
    with pytest.warns(RuntimeWarning, match="no disk tier"):
        assert main([*argv, "--cache-dir", str(blocker / "kv")]) == 0
    assert json.loads(capsys.readouterr().out)["error"] is None


def test_stream_reports_a_bad_prompt_and_runs_the_later_ones(
    gguf_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["generate", "the cat", "", "a hat", "--stream", "--model", str(gguf_path)]
    assert main([*argv, "--max-tokens", "3"]) == 1
    captured = capsys.readouterr()
    assert "empty" in _one_line(captured.err)
    assert len(captured.out.splitlines()) == 2  # both good prompts streamed a full line


@pytest.mark.parametrize(
    ("entry", "prog"),
    [
        (main, "deepinfer"),
        (spec_main, "deepinfer-spec"),
        (sched_main, "deepinfer-sched"),
        (cache_main, "deepinfer-cache"),
    ],
)
def test_every_cli_has_version(
    entry: Callable[[list[str]], int], prog: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _exit_code(entry, ["--version"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(prog + " ") and out.split()[1][0].isdigit()


@pytest.mark.parametrize(
    ("argv", "code", "needle"),
    [
        (["train", "--target", "nocolon", "--out", "x", "--synthetic", "2"], 2, "module:function"),
        (["eval", "--target", "no_such_module_x:f", "--checkpoint", "c"], 2, "cannot import"),
        (["eval", "--target", "json:nope", "--checkpoint", "c"], 2, "no callable"),
        (["eval", "--target", "a:b", "--target-kwargs", "{x", "--checkpoint", "c"], 2, "JSON"),
        (["eval", "--target", "a:b", "--temperature", "0", "--checkpoint", "c"], 2, "temperature"),
        (["eval", "--target", "a:b", "--data", "/no/such.jsonl", "--checkpoint", "c"], 2, "--data"),
        (["train", "--target", "a:b", "--steps", "0", "--out", "x"], 2, "--steps"),
    ],
)
def test_deepinfer_spec_errors_are_one_line(
    argv: list[str], code: int, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _exit_code(spec_main, argv) == code
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("deepinfer-spec") and needle in line


def test_deepinfer_spec_failure_after_loading_is_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "deepinfer_spec"))
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(list(range(i, i + 20))) for i in range(6)))
    argv = ["eval", "--target", "spec_tiny_target:make_target", "--data", str(data)]
    argv += ["--checkpoint", str(tmp_path / "missing")]
    assert _exit_code(spec_main, argv) == 1
    assert _one_line(capsys.readouterr().err).startswith("deepinfer-spec eval: error:")


def test_deepinfer_sched_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    base = ["simulate", "--trace", "synthetic", "--requests", "5", "--no-progress", "--no-plots"]
    assert _exit_code(sched_main, [*base, "--out", str(blocker / "out")]) == 1
    assert "a-file" in _one_line(capsys.readouterr().err)
    assert _exit_code(sched_main, [*base, "--out", str(tmp_path), "--trace", "/nope.jsonl"]) != 0
    _one_line(capsys.readouterr().err)
    assert _exit_code(sched_main, ["simulate", "--out", str(tmp_path)]) == 2
    assert "--trace" in _one_line(capsys.readouterr().err)


def test_deepinfer_cache_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_code(cache_main, ["size", "--model", "nope", "--tokens-per-day", "1"]) == 2
    assert "--model" in _one_line(capsys.readouterr().err)
    assert _exit_code(cache_main, ["size", "--bytes-per-token", "0", "--tokens-per-day", "1"]) == 2
    _one_line(capsys.readouterr().err)


def test_deepinfer_sched_simulate_runs_without_the_cli_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # None in sys.modules makes `import tqdm` / `import matplotlib` raise ImportError.
    for name in ("tqdm", "matplotlib", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, name, None)
    argv = ["simulate", "--trace", "synthetic", "--requests", "20", "--out", str(tmp_path)]
    assert sched_main(argv) == 0
    err = capsys.readouterr().err
    assert "tqdm is not installed" in err and "matplotlib is not installed" in err
    assert (tmp_path / "report.json").is_file()
    assert not list(tmp_path.glob("*.png"))
