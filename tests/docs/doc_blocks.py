"""Fenced code blocks of README.md and docs/*.md, with the markers that steer how they run.

A marker is an HTML comment on the line right before the fence (invisible when rendered):

- ``<!-- docs-test: skip REASON -->``: not run (a GPU, a server, the real model, a long run);
  the reason is shown in the test report, so every skip is visible and deliberate.
- ``<!-- docs-test: continues -->``: runs after the previous block of the same file, as the
  prose says ("with the objects from above").
- ``<!-- docs-test: timeout SECONDS -->``: a longer limit than the default.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE = {"python": "python", "py": "python", "bash": "bash", "sh": "bash", "shell": "bash"}
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
_MARKER = re.compile(r"<!--\s*docs-test:\s*(skip|continues|timeout)\b\s*(.*?)\s*-->")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its code and its markers."""

    path: Path
    line: int  # 1-based line of the opening fence
    language: str  # "python" or "bash"
    code: str
    skip: str | None = None
    continues: bool = False
    timeout_s: float = 60.0

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks_of(path: Path) -> list[Block]:
    """The python and bash blocks of one Markdown file, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        indent, fence, info = match.groups()
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        language = RUNNABLE.get(info.lower())
        if language is not None:
            body = [
                line[len(indent) :] if line.startswith(indent) else line
                for line in lines[i + 1 : end]
            ]
            skip, continues, timeout = None, False, 60.0
            j = i - 1
            while j >= 0 and (marker := _MARKER.search(lines[j])):
                kind, arg = marker.groups()
                if kind == "skip":
                    skip = arg or "no reason given"
                elif kind == "continues":
                    continues = True
                else:
                    timeout = float(arg)
                j -= 1
            out.append(
                Block(path, i + 1, language, "\n".join(body) + "\n", skip, continues, timeout)
            )
        i = end + 1
    return out


def all_blocks() -> list[Block]:
    return [block for path in doc_files() for block in blocks_of(path)]
