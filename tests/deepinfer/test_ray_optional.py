"""Ray stays optional: without ``--ray`` nothing imports it (checked in a fresh interpreter
where importing Ray fails), ``--ray`` without the extra is a clear error, and the ``--ray*``
options are parsed and validated without Ray."""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from serve_helpers import tiny_model

from deepinfer.serve import RayOptions, ServeConfig, add_serve_parser
from deepinfer.serve.server import config_from_args

pytest.importorskip("fastapi")

# A fresh interpreter in which any import of Ray raises; it reports what it imported.
BLOCK_RAY = textwrap.dedent(
    """
    import sys

    class NoRay:
        def find_spec(self, name, path=None, target=None):
            if name == "ray" or name.startswith("ray."):
                raise ImportError(f"test: importing {name} is blocked")
            return None

    sys.meta_path.insert(0, NoRay())
    """
)


def _run(body: str, *args: str) -> subprocess.CompletedProcess[str]:
    code = BLOCK_RAY + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=240
    )


def test_serving_without_ray_never_imports_it_and_ray_flag_names_the_extra(
    tmp_path: Path,
) -> None:
    gguf = tiny_model(tmp_path)
    result = _run(
        """
        import argparse
        import sys

        from fastapi.testclient import TestClient

        import deepinfer.cli
        from deepinfer.serve import ServeService, add_serve_parser, build_app
        from deepinfer.serve.server import config_from_args

        parser = argparse.ArgumentParser()
        add_serve_parser(parser.add_subparsers())
        try:
            config_from_args(parser.parse_args(["serve", "--ray"]))
        except SystemExit as exc:
            print("RAY_FLAG", exc)
        args = parser.parse_args(["serve", sys.argv[1], "--in-process", "--num-blocks", "64",
                                  "--block-size", "8", "--max-model-len", "128",
                                  "--served-model-name", "tiny", "--cache-dir", sys.argv[2]])
        config = config_from_args(args)
        assert config.ray is None
        with TestClient(build_app(ServeService(config))) as client:
            r = client.post("/v1/completions", json={"model": "tiny", "prompt": [5, 6, 7],
                                                     "max_tokens": 3, "ignore_eos": True})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 3
        loaded = sorted(m for m in sys.modules if m == "ray" or m.startswith("ray."))
        print("RAY_MODULES", loaded)
        """,
        str(gguf),
        str(tmp_path / "kv"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "RAY_MODULES []" in result.stdout
    assert "RAY_FLAG deepinfer serve --ray needs the 'ray' extra" in result.stdout
    assert "pip install 'deepinfer[ray]'" in result.stdout


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_ray_flags_become_ray_options() -> None:
    pytest.importorskip("ray")
    config = config_from_args(
        _parse(
            "--pd",
            "1:2",
            "--ray",
            "--ray-address",
            "auto",
            "--ray-num-cpus",
            "2",
            "--ray-prefill-resources",
            '{"prefill_node": 1}',
            "--ray-decode-resources",
            '{"decode_node": 0.5}',
            "--ray-strategy",
            "SPREAD",
            "--ray-max-restarts",
            "-1",
        )
    )
    ray = config.ray
    assert ray is not None
    assert (ray.address, ray.num_cpus, ray.strategy, ray.max_restarts) == (
        "auto",
        2.0,
        "SPREAD",
        -1,
    )
    assert ray.pool_resources("prefill") == {"prefill_node": 1}
    assert ray.pool_resources("decode") == {"decode_node": 0.5}
    assert ray.pool_resources("both") == {}
    assert ray.gpus_for("cpu") == 0.0 and ray.gpus_for("cuda:0") == 1.0
    assert config_from_args(_parse()).ray is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ray-address", "auto"], "--ray-address needs --ray"),
        (["--ray", "--ray-resources", "[1]"], "--ray-resources"),
        (["--ray", "--ray-decode-resources", "{nope"], "--ray-decode-resources"),
        (["--ray", "--ray-resources", '{"CPU": 2}'], "num_cpus"),
        (["--ray", "--ray-num-cpus", "-1"], "num_cpus"),
    ],
)
def test_bad_ray_flags_exit_naming_the_flag(argv: list[str], message: str) -> None:
    pytest.importorskip("ray")
    with pytest.raises(SystemExit, match=message):
        config_from_args(_parse(*argv))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_cpus": -0.5}, "num_cpus"),
        ({"num_gpus": -1}, "num_gpus"),
        ({"resources": {"node_a": 0}}, "resources"),
        ({"prefill_resources": {"": 1}}, "prefill_resources"),
        ({"decode_resources": {"GPU": 1}}, "decode_resources"),
        ({"strategy": "RANDOM"}, "strategy"),
        ({"max_restarts": -2}, "max_restarts"),
        ({"placement_timeout_s": 0}, "placement_timeout_s"),
        ({"address": ""}, "address"),
    ],
)
def test_ray_options_validate_naming_the_field(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        RayOptions(**kwargs)  # type: ignore[arg-type]


def test_ray_and_in_process_are_exclusive() -> None:
    with pytest.raises(ValueError, match="in_process"):
        ServeConfig(in_process=True, ray=RayOptions())
