"""``deepinfer generate --runtime {auto,lean,engine}``: the lean runtime runs in a process that
never imports torch and prints what the engine prints; options it does not run send ``auto``
to the engine and make an explicit ``lean`` a usage error naming the option."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from model_helpers import random_hf_state, tiny_config, write_tiny_gguf

from deepinfer.cli import main
from deepinfer_kernels.cpu import default_cache_dir


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = tiny_config(max_position_embeddings=512)
    path = tmp_path_factory.mktemp("lean-cli") / "tiny.gguf"
    return write_tiny_gguf(path, cfg, random_hf_state(cfg, seed=5))


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private ``$DEEPINFER_CACHE_DIR`` whose ``kernels/`` is the default kernel cache (builds
    there are atomic and locked): converted models stay private, kernels are not rebuilt."""
    root = tmp_path_factory.mktemp("lean-cli-cache")
    shared = default_cache_dir()
    shared.mkdir(parents=True, exist_ok=True)
    (root / "kernels").symlink_to(shared, target_is_directory=True)
    return root


@pytest.fixture
def private_cache(cache_root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DEEPINFER_CACHE_DIR", str(cache_root))
    return cache_root


def _stats(err: str) -> dict[str, object]:
    lines = [line for line in err.splitlines() if line.startswith('{"runtime"')]
    assert lines, err[-2000:]
    stats: dict[str, object] = json.loads(lines[-1])
    return stats


def test_generate_runs_lean_without_torch_and_prints_the_engines_output(
    gguf_path: Path, private_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["generate", "the cat", "a hat", "--model", str(gguf_path), "--max-tokens", "6",
            "--temperature", "0", "--max-model-len", "128"]  # fmt: skip
    env = {**os.environ, "DEEPINFER_CACHE_DIR": str(private_cache), "PYTHONWARNINGS": "ignore"}
    code = "import sys; from deepinfer.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", code, *argv, "--stats"], capture_output=True,
                          text=True, timeout=600, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = _stats(proc.stderr)
    assert stats["runtime"] == "lean" and stats["torch_imported"] is False, stats
    assert stats["tokens"] == 2 * 5  # tokens after each prompt's first
    assert main([*argv, "--runtime", "engine"]) == 0
    engine_out = capsys.readouterr().out
    assert proc.stdout == engine_out
    assert engine_out.splitlines()[0].startswith("the cat")


@pytest.mark.usefixtures("private_cache")
def test_json_and_stream_print_as_the_engine_does(
    gguf_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["generate", "the cat", "", "a hat", "--model", str(gguf_path), "--max-tokens", "4",
            "--temperature", "0", "--max-model-len", "64"]  # fmt: skip
    for mode in ("--json", "--stream"):
        outs = {}
        for runtime in ("lean", "engine"):
            assert main([*base, mode, "--runtime", runtime]) == 1  # the empty prompt fails
            captured = capsys.readouterr()
            assert "empty" in captured.err + captured.out
            outs[runtime] = captured.out
        assert outs["lean"] == outs["engine"], mode


@pytest.mark.usefixtures("private_cache")
def test_auto_picks_the_engine_for_an_option_lean_does_not_run(
    gguf_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["generate", "the cat", "--model", str(gguf_path), "--max-tokens", "2",
            "--temperature", "0", "--max-model-len", "64", "--stats"]  # fmt: skip
    assert main([*argv, "--repetition-penalty", "1.2"]) == 0
    stats = _stats(capsys.readouterr().err)
    assert stats["runtime"] == "engine" and "--repetition-penalty 1.2" in str(stats["reason"])
    assert main(argv) == 0
    assert _stats(capsys.readouterr().err)["runtime"] == "lean"


@pytest.mark.parametrize(
    ("extra", "needle"),
    [(["--num-blocks", "8"], "--num-blocks 8"), (["--dtype", "bfloat16"], "--dtype"),
     (["--speculative", "dspark"], "--speculative"), (["--regex", "a+"], "--regex"),
     (["--presence-penalty", "0.5"], "--presence-penalty")],
)  # fmt: skip
def test_runtime_lean_with_an_unsupported_option_is_a_usage_error(
    extra: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["generate", "hi", "--runtime", "lean", *extra])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and "--runtime lean" in err and len(err.strip().splitlines()) == 1


def test_runtime_lean_refuses_a_model_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["generate", "hi", "--runtime", "lean", "--model", str(tmp_path)])
    assert ".gguf" in capsys.readouterr().err


def test_lean_sampling_errors_name_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, needle in ((["--top-p", "0"], "top_p"), (["--temperature", "-1"], "temperature"),
                         (["--threads", "0"], "--threads")):  # fmt: skip
        with pytest.raises(SystemExit) as exc:
            main(["generate", "hi", "--runtime", "lean", *argv])
        assert exc.value.code == 2
        assert needle in capsys.readouterr().err
