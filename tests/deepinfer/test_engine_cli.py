"""The `deepinfer` CLI on a tiny random GGUF model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from model_helpers import random_hf_state, tiny_config, write_tiny_gguf

from deepinfer.cli import build_parser, main


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = tiny_config(max_position_embeddings=512)
    path = tmp_path_factory.mktemp("cli-model") / "tiny.gguf"
    return write_tiny_gguf(path, cfg, random_hf_state(cfg, seed=5))


def test_demo_drafts_with_dspark_unless_told_not_to() -> None:
    parser = build_parser()
    assert parser.parse_args(["demo"]).speculative == "dspark"
    assert parser.parse_args(["demo", "--no-speculative"]).speculative is None
    assert parser.parse_args(["generate", "hi"]).speculative is None


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI converts the model and keeps KV under ``$DEEPINFER_CACHE_DIR``: a fresh one."""
    monkeypatch.setenv("DEEPINFER_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.usefixtures("private_cache")
def test_generate_json_reports_each_prompt(
    gguf_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "generate",
        "the cat",
        "a hat",
        "--model",
        str(gguf_path),
        "--max-tokens",
        "4",
        "--json",
    ]
    assert main(args) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [line["prompt"] for line in lines] == ["the cat", "a hat"]
    assert all(line["error"] is None and isinstance(line["text"], str) for line in lines)
    # Greedy by default: a second run gives the same text (served from the prefix cache now).
    assert main(args) == 0
    again = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert again == lines


@pytest.mark.usefixtures("private_cache")
def test_generate_fails_cleanly_on_an_empty_prompt(
    gguf_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["generate", "", "--model", str(gguf_path), "--max-tokens", "2"]) == 1
    assert "empty" in capsys.readouterr().err
