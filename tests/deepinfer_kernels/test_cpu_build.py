"""Building and loading the compiled CPU kernels: one warning, remembered failures, checked
signatures, the compiler's version asked once, and ahead-of-time builds used first."""

from __future__ import annotations

import ctypes
import re
import shutil
import warnings
from pathlib import Path

import pytest

from deepinfer_kernels.cpu import (
    ALL_SOURCES,
    CpuKernels,
    CSignature,
    CSource,
    NativeAbiError,
    NativeFunction,
)
from deepinfer_kernels.cpu.aot import build_all
from deepinfer_kernels.cpu.native import LoadedLibraries, compiler_available

needs_compiler = pytest.mark.skipif(not compiler_available(), reason="no C compiler")

ABI_C = """
#include <stdint.h>
int64_t twice(int64_t x) { return 2 * x; }
const char *deepinfer_abi_%(stem)s(void) { return "%(abi)s"; }
"""


def logging_compiler(tmp_path: Path) -> tuple[str, Path]:
    """A ``$CC`` that logs each invocation's arguments, then runs the real compiler."""
    real = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    assert real is not None
    log = tmp_path / "cc.log"
    script = tmp_path / "logging-cc"
    script.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {real} "$@"\n')
    script.chmod(0o755)
    return str(script), log


def invocations(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_without_a_compiler_every_kernel_warns_once_in_all(
    tmp_path: Path, no_c_compiler: None
) -> None:
    kernels = CpuKernels.all(cache_dir=tmp_path / "k", enabled=True)
    handles = (kernels.linear, kernels.norm, kernels.attention, kernels.layer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            assert not any(h is not None and h.available() for h in handles)
    ours = [w for w in caught if "compiled CPU kernels" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    assert "no C compiler" in str(ours[0].message)


@needs_compiler
def test_a_failed_build_is_remembered_per_process_and_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cc, log = logging_compiler(tmp_path)
    monkeypatch.setenv("CC", cc)
    source = tmp_path / "broken.c"
    source.write_text("int f(void) { return undeclared; }\nint g(void) { return 1; }\n")
    cache = tmp_path / "cache"
    libs = LoadedLibraries()
    first = NativeFunction(source, "f", [], cache_dir=cache, enabled=True)
    with pytest.warns(RuntimeWarning, match="undeclared"):
        assert not first.available()
    compiles = [c for c in invocations(log) if "--version" not in c]
    assert len(compiles) == 1
    # Another symbol of the same file, in this process: no second attempt.
    assert not NativeFunction(source, "g", [], cache_dir=cache, enabled=True).available()
    assert len([c for c in invocations(log) if "--version" not in c]) == 1
    # A later process (a fresh loader) reads the failure instead of compiling.
    with pytest.raises(RuntimeError, match="earlier build"):
        libs.load(source, cache)
    assert len([c for c in invocations(log) if "--version" not in c]) == 1
    # A fixed source has another key: the next process builds it.
    source.write_text("int f(void) { return 3; }\n")
    fixed = LoadedLibraries().load(source, cache).f
    fixed.restype = ctypes.c_int
    assert fixed() == 3


@needs_compiler
def test_the_compiler_version_is_asked_once_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cc, log = logging_compiler(tmp_path)
    monkeypatch.setenv("CC", cc)
    libs = LoadedLibraries()
    for i in range(3):
        src = tmp_path / f"k{i}.c"
        src.write_text(f"int f{i}(void) {{ return {i}; }}\n")
        libs.load(src, tmp_path / "cache")
    assert sum("--version" in c for c in invocations(log)) == 1


def _abi_source(tmp_path: Path, stem: str, exported: str) -> Path:
    path = tmp_path / f"{stem}.c"
    path.write_text(ABI_C % {"stem": stem, "abi": exported})
    return path


@needs_compiler
def test_a_signature_that_differs_from_the_c_file_fails_loudly(tmp_path: Path) -> None:
    path = _abi_source(tmp_path, "twice_a", "1|twice(i)i")
    good = CSource(path, 1, (CSignature("twice", "i", "i"),))
    fn = NativeFunction(good, "twice", cache_dir=tmp_path / "c1", enabled=True)
    assert fn.available() and fn(21) == 42
    with pytest.raises(TypeError, match="takes 1 arguments, got 2"):
        fn(1, 2)  # ctypes would pass the surplus through unchecked
    # The table says two arguments; the library says one: refused, not warned about.
    wrong = CSource(path, 1, (CSignature("twice", "ii", "i"),))
    with pytest.raises(NativeAbiError, match="differs"):
        NativeFunction(wrong, "twice", cache_dir=tmp_path / "c2", enabled=True).available()
    newer = CSource(path, 2, (CSignature("twice", "i", "i"),))
    with pytest.raises(NativeAbiError, match="differs"):
        NativeFunction(newer, "twice", cache_dir=tmp_path / "c3", enabled=True).available()
    other = tmp_path / "plain.c"
    other.write_text("int twice(int x) { return 2 * x; }\n")
    missing = CSource(other, 1, (CSignature("twice", "i", "i"),))
    with pytest.raises(NativeAbiError, match="exports no deepinfer_abi_plain"):
        NativeFunction(missing, "twice", cache_dir=tmp_path / "c4", enabled=True).available()
    with pytest.raises(ValueError, match="argtypes"):
        NativeFunction(good, "twice", [ctypes.c_float])


_PROTOTYPE = re.compile(r"^(void|int)\s+(deepinfer_\w+)\s*\(([^)]*)\)\s*\{", re.MULTILINE)


def _letters(params: str) -> str:
    out = ""
    for p in (p.strip() for p in params.split(",") if p.strip()):
        if "*" in p:
            out += "p"
        elif p.startswith("int64_t"):
            out += "i"
        elif p.startswith("float"):
            out += "f"
        else:
            raise AssertionError(f"parameter type the table cannot express: {p!r}")
    return out


@pytest.mark.parametrize("source", ALL_SOURCES, ids=lambda s: s.path.stem)
def test_the_table_matches_each_c_prototype(source: CSource) -> None:
    """The table's argument letters come from the C prototypes, and the C file's ABI string is
    the table's (so neither side can drift without this failing)."""
    text = source.path.read_text()
    found = {name: (ret, _letters(params)) for ret, name, params in _PROTOTYPE.findall(text)}
    for sig in source.functions:
        assert sig.symbol in found, f"{source.path.name} defines no {sig.symbol}"
        ret, letters = found[sig.symbol]
        assert letters == sig.args, sig.symbol
        assert {"void": "v", "int": "i"}[ret] == sig.ret, sig.symbol
    assert f'{source.abi_symbol}(void) {{ return "{source.abi_string()}"; }}' in text


@needs_compiler
def test_an_ahead_of_time_build_is_loaded_without_a_compiler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = build_all(tmp_path / "prebuilt")
    assert len(built) == len(ALL_SOURCES) and all(p.is_file() for p in built)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert not compiler_available()
    kernels = CpuKernels.all(cache_dir=tmp_path, enabled=True)
    handles = (kernels.linear, kernels.norm, kernels.attention, kernels.layer)
    assert all(h is not None and h.available() for h in handles)
    assert not list(tmp_path.glob("*.so"))  # nothing built at run time
