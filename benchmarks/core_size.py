"""Size of the integration core that #19's "Done when" bounds (~3k lines).

The core is ``deepinfer/`` without ``models/``, ``pd/``, ``serve/``, the CLI and the demo.
Prints physical lines and code lines (no docstrings, comments or blank lines), in total and
per file, for the working tree or a git revision::

    .venv/bin/python benchmarks/core_size.py            # the working tree
    .venv/bin/python benchmarks/core_size.py --rev 5ae9f4f
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXCLUDED_DIRS = ("deepinfer/models/", "deepinfer/pd/", "deepinfer/serve/")
EXCLUDED_FILES = ("cli.py", "cli_errors.py", "cli_options.py", "demo.py")
_SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}


def in_core(path: str) -> bool:
    return (
        path.startswith("deepinfer/")
        and path.endswith(".py")
        and not path.startswith(EXCLUDED_DIRS)
        and path.rsplit("/", 1)[-1] not in EXCLUDED_FILES
    )


def code_lines(source: str) -> int:
    """Lines holding a token that is not a comment, a docstring or layout."""
    docs: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        kinds = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        if isinstance(node, kinds) and node.body:
            first = node.body[0]
            value = first.value if isinstance(first, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docs.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in _SKIP and tok.type != tokenize.ENDMARKER:
            lines.update(n for n in range(tok.start[0], tok.end[0] + 1) if n not in docs)
    return len(lines)


def sources(rev: str | None) -> dict[str, str]:
    if rev is None:
        paths = [p.relative_to(ROOT).as_posix() for p in (ROOT / "deepinfer").rglob("*.py")]
        return {p: (ROOT / p).read_text() for p in sorted(paths) if in_core(p)}
    listing = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, "deepinfer"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return {
        p: subprocess.run(
            ["git", "show", f"{rev}:{p}"], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout
        for p in sorted(listing)
        if in_core(p)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", help="a git revision (default: the working tree)")
    args = parser.parse_args()
    files = sources(args.rev)
    rows = [(len(text.splitlines()), code_lines(text), path) for path, text in files.items()]
    for physical, code, path in sorted(rows):
        print(f"{physical:6d} {code:6d}  {path}")
    print(f"{sum(r[0] for r in rows):6d} {sum(r[1] for r in rows):6d}  total physical / code")


if __name__ == "__main__":
    main()
