"""Type checks shared by the config dataclasses: JSON hands them strings and floats where
ints belong, and a wrong type must fail at construction naming the field, not mid-run."""

from __future__ import annotations

import math
import numbers

__all__ = ["check_bool", "check_int", "check_real"]


def check_int(owner: str, name: str, value: object) -> None:
    """``value`` is an int (numpy integers too), not a bool, a float or a string."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{owner}.{name} must be an integer, got {value!r}")


def check_real(owner: str, name: str, value: object, finite: bool = True) -> None:
    """``value`` is a real number (ints allowed), finite unless ``finite`` is False."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}.{name} must be a number, got {value!r}")
    if finite and not math.isfinite(value):
        raise ValueError(f"{owner}.{name} must be finite, got {value!r}")


def check_bool(owner: str, name: str, value: object) -> None:
    """``value`` is True or False (JSON ``true``/``false``), not 0/1 or a string."""
    if not isinstance(value, bool):
        raise TypeError(f"{owner}.{name} must be true or false, got {value!r}")
