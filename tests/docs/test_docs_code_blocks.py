"""Every python and bash block of README.md and docs/*.md runs as written.

Python blocks run in a subprocess, one per Markdown file (importing torch once per file, not
once per block), each block in a fresh namespace and its own empty working directory, under a
timeout; a ``continues`` block runs in the namespace its predecessor left. Bash blocks run
alone with ``bash -e``. A failure names the file and the line of the block. Blocks that need a
GPU, a running server, the real model or minutes of work carry a visible
``<!-- docs-test: skip REASON -->`` marker before the fence (markers: ``doc_blocks.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from doc_blocks import Block, all_blocks, blocks_of

BLOCKS = all_blocks()

_RUNNER = r"""
import json, os, signal, sys, traceback

spec = json.load(open(sys.argv[1], encoding="utf-8"))

def _timeout(signum, frame):
    raise TimeoutError("the block ran past its timeout")

signal.signal(signal.SIGALRM, _timeout)
results, namespace = {}, None
for block in spec:
    if not block["continues"] or namespace is None:
        namespace = {"__name__": "__main__"}
    os.chdir(block["cwd"])
    signal.alarm(max(1, int(block["timeout"])))
    try:
        exec(compile(block["code"], block["name"], "exec"), namespace)
        results[block["name"]] = None
    except BaseException:
        results[block["name"]] = traceback.format_exc()[-3000:]
    finally:
        signal.alarm(0)
with open(sys.argv[2], "w", encoding="utf-8") as fh:
    json.dump(results, fh)
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["MPLBACKEND"] = "Agg"
    return env


@pytest.fixture(scope="module")
def python_results(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, dict[str, str | None]]:
    """Lazily, per file: block name -> None (ran) or the traceback's tail."""
    return {}


def _run_python_file(path: Path, workdir: Path) -> dict[str, str | None]:
    """Run the file's unskipped python blocks in one subprocess: block name -> error or None.

    The blocks are the ones collected at import (not the file re-read now), so a doc edited
    during a run cannot make the collected names disagree with the results."""
    blocks = [b for b in BLOCKS if b.path == path and b.language == "python" and b.skip is None]
    return _run_python_blocks(blocks, [b.name for b in blocks], workdir)


def _run_python_blocks(
    blocks: list[Block], names: list[str], workdir: Path
) -> dict[str, str | None]:
    spec = []
    for block, name in zip(blocks, names):
        cwd = workdir / f"line-{block.line}"
        cwd.mkdir()
        spec.append(
            {
                "name": name,
                "code": block.code,
                "continues": block.continues,
                "timeout": block.timeout_s,
                "cwd": str(cwd),
            }
        )
    (workdir / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
    (workdir / "runner.py").write_text(_RUNNER, encoding="utf-8")
    out = workdir / "results.json"
    budget = 30.0 + sum(b["timeout"] for b in spec)
    proc = subprocess.run(
        [sys.executable, str(workdir / "runner.py"), str(workdir / "spec.json"), str(out)],
        cwd=workdir,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=budget,
    )
    if not out.is_file():
        tail = (proc.stderr or proc.stdout)[-3000:]
        raise AssertionError(f"{names[0] if names else workdir}: the block runner died\n{tail}")
    return dict(json.loads(out.read_text(encoding="utf-8")))


def _run_bash(block: Block, cwd: Path) -> str | None:
    script = cwd / "block.sh"
    script.write_text(block.code, encoding="utf-8")
    try:
        proc = subprocess.run(
            ["bash", "-e", "-o", "pipefail", str(script)],
            cwd=cwd,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=block.timeout_s,
        )
    except subprocess.TimeoutExpired:
        return f"ran past {block.timeout_s} s"
    return None if proc.returncode == 0 else f"exit {proc.returncode}\n{proc.stderr[-3000:]}"


def test_blocks_are_found() -> None:
    assert any(b.name.startswith("README.md:") for b in BLOCKS)
    assert len(BLOCKS) >= 20
    assert all(b.language in ("python", "bash") for b in BLOCKS)
    for block in BLOCKS:
        if block.continues:
            same_file = blocks_of(block.path)
            index = next(i for i, b in enumerate(same_file) if b.line == block.line)
            assert index > 0, f"{block.name}: 'continues' on a file's first block"
            assert same_file[index - 1].language == block.language, block.name
            assert same_file[index - 1].skip is None, f"{block.name} continues a skipped block"


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_doc_block_runs_as_written(
    block: Block,
    tmp_path: Path,
    python_results: dict[Path, dict[str, str | None]],
) -> None:
    if block.skip is not None:
        pytest.skip(f"{block.name}: {block.skip}")
    if block.language == "bash":
        error = _run_bash(block, tmp_path)
    else:
        if block.path not in python_results:
            python_results[block.path] = _run_python_file(block.path, tmp_path)
        error = python_results[block.path][block.name]
    if error is not None:
        pytest.fail(f"{block.name}: {block.language} block failed\n{error}", pytrace=False)


def test_markers_are_read(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "text\n\n```python\nx = 1\n```\n\n<!-- docs-test: continues -->\n"
        "<!-- docs-test: timeout 5 -->\n```python\nprint(x)\n```\n\n"
        "<!-- docs-test: skip needs a GPU -->\n```bash\nnvidia-smi\n```\n\n```text\nnot code\n```\n"
    )
    first, second, third = blocks_of(doc)
    assert (first.line, first.continues, first.skip) == (3, False, None)
    assert (second.line, second.continues, second.timeout_s) == (9, True, 5.0)
    assert (third.language, third.skip) == ("bash", "needs a GPU")


def test_a_failing_block_is_named_by_file_and_line(tmp_path: Path) -> None:
    doc = tmp_path / "broken.md"
    doc.write_text("```python\nx = 1\n```\n\n```python\nprint(undefined_name)\n```\n")
    blocks = blocks_of(doc)
    results = _run_python_blocks(blocks, ["broken.md:1", "broken.md:5"], tmp_path)
    assert results["broken.md:1"] is None
    error = results["broken.md:5"] or ""
    assert "NameError" in error and 'File "broken.md:5", line 1' in error
