"""Durations: a number of seconds, a ``timedelta`` or a string such as ``"500ms"``, ``"30s"``."""

from __future__ import annotations

import datetime
import math
import re

Duration = float | int | datetime.timedelta | str

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_RULE = 'a number of seconds, a timedelta, or a string like "500ms", "30s", "2m", "1h", "7d"'


def to_milliseconds(value: Duration, *, name: str, allow_zero: bool = False) -> int:
    """``value`` in whole milliseconds (rounded up, so a tiny positive value stays positive).

    Raises ``TypeError`` for a value of the wrong type and ``ValueError`` for an unparsable,
    negative or (unless ``allow_zero``) zero value; the message names ``name`` and the rule.
    """
    kind = "a non-negative" if allow_zero else "a positive"
    if isinstance(value, bool) or not isinstance(value, int | float | datetime.timedelta | str):
        raise TypeError(f"`{name}` must be {kind} duration ({_RULE}), got {value!r}")
    if isinstance(value, str):
        match = _PATTERN.match(value)
        if match is None:
            raise ValueError(f"`{name}` must be {kind} duration ({_RULE}), got {value!r}")
        ms = float(match.group(1)) * _UNITS_MS[match.group(2)]
    elif isinstance(value, datetime.timedelta):
        ms = value.total_seconds() * 1000
    else:
        ms = float(value) * 1000
    if not math.isfinite(ms) or ms < 0 or (ms == 0 and not allow_zero):
        raise ValueError(f"`{name}` must be {kind} duration ({_RULE}), got {value!r}")
    return math.ceil(ms)


def to_seconds(value: Duration, *, name: str, allow_zero: bool = False) -> float:
    """``value`` in seconds, validated as :func:`to_milliseconds` does."""
    return to_milliseconds(value, name=name, allow_zero=allow_zero) / 1000
