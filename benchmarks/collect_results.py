"""Assemble docs/benchmarks.md from the per-area result files in benchmarks/results/.

Each benchmark writes its figures (and the command that reproduces them) to
benchmarks/results/<area>.md; this script stitches them into one page, rewriting relative
links so images still resolve from docs/.

    python benchmarks/collect_results.py
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TARGET = ROOT / "docs" / "benchmarks.md"
LINK = re.compile(r"(!?\[[^\]]*\])\(([^)\s]+)\)")

HEADER = """# Benchmarks

Every figure below was measured by a script or pytest-benchmark file under `benchmarks/`; each
section names the command that reproduces it. Speed targets are ratios against a baseline run in
the same process. CPU figures come from the 2-core development machine (shared with other jobs
while they were taken, so absolute times are noisy; ratios are the point). GPU figures need
`benchmarks/gpu_check.py` on a CUDA machine: where a section says "not run", no GPU was
available in that session.

"""


def _relink(text: str, source: Path) -> str:
    def fix(m: re.Match[str]) -> str:
        label, target = m.groups()
        if re.match(r"^[a-z]+:|^#|^/", target):
            return m.group(0)
        resolved = (source.parent / target).resolve()
        return f"{label}({os.path.relpath(resolved, TARGET.parent)})"

    return LINK.sub(fix, text)


def _demote(text: str) -> str:
    return re.sub(r"^(#+) ", lambda m: "#" + m.group(1) + " ", text, flags=re.MULTILINE)


def main() -> None:
    parts = [HEADER]
    files = sorted(RESULTS.glob("*.md"))
    parts.append("Sections: " + ", ".join(f"`{f.stem}`" for f in files) + "\n")
    for f in files:
        body = _demote(_relink(f.read_text(encoding="utf-8"), f)).strip()
        parts.append(f"\n<!-- from benchmarks/results/{f.name} -->\n{body}\n")
    TARGET.write_text("\n".join(parts), encoding="utf-8")
    print(f"wrote {TARGET} from {len(files)} result files")


if __name__ == "__main__":
    main()
