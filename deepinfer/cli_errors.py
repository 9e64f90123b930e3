"""How the command line reports failures: one line, no traceback."""

from __future__ import annotations

from importlib import metadata

# Exceptions whose message already says what went wrong; others get their type name in front
# (a bare KeyError message is just the key).
_SELF_EXPLAINING = (ValueError, TypeError, OSError, RuntimeError)


def error_line(error: BaseException | str) -> str:
    """``error`` as one line: whitespace collapsed, the type named where the message alone
    would not say what happened."""
    if isinstance(error, str):
        return " ".join(error.split()) or "unknown error"
    message = " ".join(str(error).split())
    if not message:
        return type(error).__name__
    if isinstance(error, _SELF_EXPLAINING) and type(error).__module__ == "builtins":
        return message
    return f"{type(error).__name__}: {message}"


def package_version(distribution: str) -> str:
    """The installed version of ``distribution`` (``unknown`` when it is not installed)."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"
