"""The C functions' signatures, declared once, and the check that a loaded library has them.

A foreign call through ``ctypes`` trusts its declared argument types: a Python table that
disagrees with the C prototype passes garbage where a pointer is read, and corrupts memory
instead of failing. So each C file exports ``const char *deepinfer_abi_<file stem>(void)``
returning its ABI string, ``"<version>|<symbol>(<args>)<ret>|..."`` with one letter per
argument (``p`` pointer, ``i`` int64, ``f`` float; return ``v`` void or ``i`` int), and
:class:`CSource` (the Python side, in :mod:`deepinfer_kernels.cpu.sources`) builds the same
string from its table. Loading a library compares the two and raises :class:`NativeAbiError` on
any difference (a missing symbol, another version, another argument list): that is a bug or a
stale binary, never a reason to run. A test parses the C prototypes themselves against the
table, so the C file's string cannot drift from its functions either.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_ARG_TYPES: dict[str, Any] = {"p": ctypes.c_void_p, "i": ctypes.c_int64, "f": ctypes.c_float}
_RET_TYPES: dict[str, Any] = {"v": None, "i": ctypes.c_int}


class NativeAbiError(RuntimeError):
    """A loaded library's functions differ from the declared signatures (not a build failure:
    callers must not fall back silently)."""


@dataclass(frozen=True)
class CSignature:
    """One exported C function: ``args`` one letter per argument (``p``/``i``/``f``)."""

    symbol: str
    args: str
    ret: str = "v"

    def __post_init__(self) -> None:
        if not self.symbol.isidentifier():
            raise ValueError(f"symbol: expected a C identifier, got {self.symbol!r}")
        if any(a not in _ARG_TYPES for a in self.args):
            raise ValueError(f"args: expected letters of {''.join(_ARG_TYPES)}, got {self.args!r}")
        if self.ret not in _RET_TYPES:
            raise ValueError(f"ret: expected one of {''.join(_RET_TYPES)}, got {self.ret!r}")

    @property
    def argtypes(self) -> list[Any]:
        return [_ARG_TYPES[a] for a in self.args]

    @property
    def restype(self) -> Any:
        return _RET_TYPES[self.ret]

    def declaration(self) -> str:
        return f"{self.symbol}({self.args}){self.ret}"


@dataclass(frozen=True)
class CSource:
    """A C file, the ABI version it exports and its functions' signatures."""

    path: Path
    version: int
    functions: tuple[CSignature, ...]

    def __post_init__(self) -> None:
        if self.version < 1:
            raise ValueError(f"version: expected >= 1, got {self.version}")
        names = [f.symbol for f in self.functions]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"functions: expected distinct symbols, got {names}")

    @property
    def abi_symbol(self) -> str:
        return f"deepinfer_abi_{self.path.stem}"

    def abi_string(self) -> str:
        return "|".join([str(self.version), *(f.declaration() for f in self.functions)])

    def signature(self, symbol: str) -> CSignature:
        for f in self.functions:
            if f.symbol == symbol:
                return f
        raise ValueError(f"symbol: {self.path.name} declares no {symbol!r}")

    def check(self, lib: ctypes.CDLL) -> None:
        """Raise :class:`NativeAbiError` unless ``lib`` exports this file's ABI string."""
        try:
            fn = getattr(lib, self.abi_symbol)
        except AttributeError as exc:
            raise NativeAbiError(
                f"{lib._name} exports no {self.abi_symbol}: not a library built from "
                f"{self.path.name} of this version"
            ) from exc
        fn.argtypes, fn.restype = [], ctypes.c_char_p
        got = fn()
        got = got.decode() if isinstance(got, bytes) else None
        if got != self.abi_string():
            raise NativeAbiError(
                f"{lib._name}: ABI {got!r} differs from the declared {self.abi_string()!r}; "
                "the Python table and the C file disagree (or the library is stale)"
            )
