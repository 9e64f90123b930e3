"""PEP 562 lazy re-exports for the ``deepinfer`` packages, so that ``import deepinfer`` and the
CLI load no torch until a name that needs it is used (the lean CPU runtime, ``deepinfer.lean``,
runs without torch).

Example::

    # in a package's __init__.py
    _EXPORTS = {"LLM": "deepinfer.llm"}  # public name -> module that defines it
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose globals are ``namespace``.

    A name in ``exports`` is imported from its module on first use and stored in ``namespace``, so
    later lookups skip ``__getattr__``; any other name is tried as a submodule (the eager package
    had imported them all), else the usual ``AttributeError``. ``__dir__`` lists the globals and
    ``__all__``."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            try:
                return import_module(f"{package}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(namespace.get("__all__", ())))

    return __getattr__, __dir__
