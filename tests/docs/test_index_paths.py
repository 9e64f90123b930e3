"""docs/index.md names files that exist: the layout table and the request's path (#19: "a
request's path in at most ~15 files").

A backticked name with a ``/`` or a ``.py`` suffix is a path. ``.../`` stands for any folders
(``deepinfer_kernels/.../sampling/`` is under ``src/deepinfer_kernels``); a name without a
package root (``fanout.py``, ``engine/client.py``, ``kv/write.py``: relative to the step's
package) must be found in one of the packages.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INDEX = ROOT / "docs" / "index.md"
ROOTS = ("deepinfer/", "deepinfer_", "recipes/", "benchmarks/", "tests/")


def _section(text: str, start: str, end: str) -> str:
    return text[text.index(start) : text.index(end, text.index(start))]


def _paths(text: str) -> list[str]:
    names = re.findall(r"`([A-Za-z0-9_./]+)`", text)
    return [n for n in names if "/" in n or n.endswith(".py")]


def _exists(name: str) -> bool:
    pattern = name.rstrip("/").replace("...", "**")
    if name.startswith(ROOTS):
        top = pattern.split("/", 1)
        base = ROOT / top[0]
        return base.exists() and (len(top) == 1 or any(base.glob(top[1])))
    packages = [ROOT / "deepinfer", *ROOT.glob("deepinfer_*/src")]
    return any(any(p.glob(f"**/{pattern}")) for p in packages)


def test_the_layout_table_names_existing_files() -> None:
    table = _section(INDEX.read_text(), "| folder / file |", "A request's path")
    names = _paths(table)
    assert "deepinfer/engine/" in names and "deepinfer/builder.py" in names
    missing = [n for n in names if not _exists(n)]
    assert not missing, f"docs/index.md layout names files that do not exist: {missing}"


def test_the_request_path_is_at_most_15_steps_through_existing_files() -> None:
    path = _section(INDEX.read_text(), "A request's path", "## From a request to a token")
    steps = re.findall(r"^\d+\. ", path, flags=re.MULTILINE)
    assert 1 <= len(steps) <= 15
    names = _paths(path)
    assert len(names) >= len(steps)
    missing = [n for n in names if not _exists(n)]
    assert not missing, f"docs/index.md request path names files that do not exist: {missing}"


def test_a_missing_file_is_reported() -> None:
    assert _exists("deepinfer/engine/engine.py")
    assert _exists("deepinfer_kernels/.../sampling/grammar.py")
    assert _exists("fanout.py")
    assert not _exists("deepinfer/engine/structured_output.py")
    assert not _exists("deepinfer_kernels/.../sampling/no_such_file.py")
    assert not _exists("no_such_file.py")
