"""Row-parsing helpers shared by the trace loaders: every error names the file and line."""

from __future__ import annotations

import csv
import math
import os
import re
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone

__all__ = ["RowError", "parse_float", "parse_int", "parse_time", "read_csv_rows", "unique_ids"]


class RowError(ValueError):
    """A bad row: ``ValueError`` whose message starts with ``<file>:<line>:``."""

    def __init__(self, path: str | os.PathLike[str], line: int, message: str) -> None:
        super().__init__(f"{os.fspath(path)}:{line}: {message}")
        self.path = os.fspath(path)
        self.line = line


def parse_int(
    raw: object, column: str, path: str | os.PathLike[str], line: int, minimum: int = 0
) -> int:
    """An integer >= ``minimum`` (``"12"``, ``12`` and ``"12.0"`` accepted, bools not)."""
    value: int | None = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, float) and raw.is_integer():
        value = int(raw)
    elif isinstance(raw, str):
        s = raw.strip()
        try:
            value = int(s)
        except ValueError:
            try:
                f = float(s)
            except ValueError:
                f = math.nan
            if f.is_integer():
                value = int(f)
    if value is None:
        raise RowError(path, line, f"column {column!r}: expected an integer, got {raw!r}")
    if value < minimum:
        raise RowError(path, line, f"column {column!r}: expected >= {minimum}, got {value}")
    return value


def parse_float(raw: object, column: str, path: str | os.PathLike[str], line: int) -> float:
    """A finite float >= 0."""
    try:
        if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
            raise ValueError
        value = float(raw)
    except ValueError:
        raise RowError(path, line, f"column {column!r}: expected a number, got {raw!r}") from None
    if not (math.isfinite(value) and value >= 0.0):
        raise RowError(path, line, f"column {column!r}: expected a finite number >= 0, got {raw!r}")
    return value


_FRACTION = re.compile(r"(\.\d{6})\d+")


def parse_time(raw: str, column: str, path: str | os.PathLike[str], line: int) -> float:
    """Seconds: a plain number, or an ISO date-time (UTC when naive) as POSIX seconds."""
    s = raw.strip()
    try:
        return float(s) if s and (s[0].isdigit() or s[0] == ".") and ":" not in s else _iso(s)
    except ValueError:
        raise RowError(
            path, line, f"column {column!r}: expected seconds or an ISO date-time, got {raw!r}"
        ) from None


def _iso(s: str) -> float:
    # Python 3.10's fromisoformat takes at most 6 fractional digits; Azure writes 7.
    dt = datetime.fromisoformat(_FRACTION.sub(r"\1", s))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def read_csv_rows(
    path: str | os.PathLike[str], required: Sequence[str]
) -> Iterator[tuple[int, dict[str, str]]]:
    """``(line number, row)`` for each data row; raises when a required column is missing or
    a row has the wrong number of fields."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise RowError(path, 1, "empty file, expected a CSV header") from None
        missing = [c for c in required if c not in header]
        if missing:
            raise RowError(path, 1, f"missing columns {missing} in header {header}")
        for row in reader:
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != len(header):
                raise RowError(
                    path, reader.line_num, f"expected {len(header)} fields, got {len(row)}"
                )
            yield reader.line_num, dict(zip(header, row))


def unique_ids(next_id: int, count: int) -> tuple[int, ...]:
    """Fresh block ids ``next_id .. next_id + count - 1`` for traces without prefix data."""
    return tuple(range(next_id, next_id + count))
