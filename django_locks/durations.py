"""Durations: a number of seconds, a ``timedelta`` or a string such as ``"500ms"``, ``"30s"``."""

from __future__ import annotations

import datetime
import math
import re

from django_locks.policy import MIN_TTL_MS as MIN_TTL_MS  # the renewal policy's, read here

Duration = float | int | datetime.timedelta | str

MAX_DURATION_MS = 31_622_400_000
"""366 days: the longest ttl, wait, min_hold or max_hold, and the longest ``ttl_ms`` a store
must accept. Far below every timer's, socket's and SQL interval's limit."""

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_RULE = 'a number of seconds, a timedelta, or a string like "500ms", "30s", "2m", "1h", "7d"'


def to_milliseconds(value: Duration, *, name: str, allow_zero: bool = False) -> int:
    """``value`` in whole milliseconds (rounded up, so a tiny positive value stays positive).

    Raises ``TypeError`` for a value of the wrong type (``bool`` included) and ``ValueError`` for
    an unparsable, negative, non-finite, too large for a float or (unless ``allow_zero``) zero
    value; the message names ``name``, the rule and the value. No upper bound: the helpers
    below (:func:`ttl_ms`, :func:`wait_ms`, ...) add the bounds of the public surface.
    """
    kind = "a non-negative duration" if allow_zero else "a positive duration"
    ms = _parse(value, name, kind)
    if ms < 0 or (ms == 0 and not allow_zero):
        raise _invalid(name, kind, value)
    return math.ceil(ms)


def to_seconds(value: Duration, *, name: str, allow_zero: bool = False) -> float:
    """``value`` in seconds, validated as :func:`to_milliseconds` does."""
    return to_milliseconds(value, name=name, allow_zero=allow_zero) / 1000


def bounded_ms(value: Duration, *, name: str, minimum_ms: int, maximum_ms: int) -> int:
    """``value`` in whole milliseconds (rounded up), from ``minimum_ms`` to ``maximum_ms``.

    ``ValueError`` / ``TypeError`` naming ``name``, the bounds and the value otherwise.
    """
    kind = _bounds(minimum_ms, maximum_ms)
    ms = _parse(value, name, kind)
    # Compared before rounding: a huge float must not become a huge int first.
    if not 0 <= ms <= maximum_ms or math.ceil(ms) < minimum_ms:
        raise _invalid(name, kind, value)
    return math.ceil(ms)


def timeout_seconds(value: Duration, *, name: str) -> float:
    """A store's own timeout option (a call, a socket, a connect): 1 ms to 366 days, so that no
    option, however large, reaches a socket timeout or a wait as an overflow."""
    return bounded_ms(value, name=name, minimum_ms=1, maximum_ms=MAX_DURATION_MS) / 1000


def ttl_ms(value: Duration, *, name: str = "ttl") -> int:
    """A lock's ttl: 50 ms to 366 days."""
    return bounded_ms(value, name=name, minimum_ms=MIN_TTL_MS, maximum_ms=MAX_DURATION_MS)


def wait_ms(value: Duration, *, name: str = "wait") -> int:
    """How long to keep trying to acquire: 0 to 366 days."""
    return bounded_ms(value, name=name, minimum_ms=0, maximum_ms=MAX_DURATION_MS)


def min_hold_ms(value: Duration, *, name: str = "min_hold") -> int:
    """How long a command's owner lease stays taken after its run's start: 0 to 366 days."""
    return bounded_ms(value, name=name, minimum_ms=0, maximum_ms=MAX_DURATION_MS)


def max_hold_ms(value: Duration | None, *, name: str = "max_hold") -> int | None:
    """The longest a lock may be held: ``None`` (no limit) or 50 ms to 366 days."""
    if value is None:
        return None
    kind = "None or " + _bounds(MIN_TTL_MS, MAX_DURATION_MS)
    try:
        return ttl_ms(value, name=name)
    except TypeError:
        raise TypeError(_message(name, kind, value)) from None
    except ValueError:
        raise ValueError(_message(name, kind, value)) from None


def lease_ms(value: Duration, *, name: str = "duration") -> int:
    """How long a lease is left in the store unrenewed (``Lock.leave_for``): 1 ms to 366 days."""
    return bounded_ms(value, name=name, minimum_ms=1, maximum_ms=MAX_DURATION_MS)


def _parse(value: object, name: str, kind: str) -> float:
    """``value`` in (unrounded, finite) milliseconds; a ``TypeError`` / ``ValueError`` else."""
    if isinstance(value, bool) or not isinstance(value, int | float | datetime.timedelta | str):
        raise TypeError(_message(name, kind, value))
    try:
        if isinstance(value, str):
            match = _PATTERN.match(value)
            if match is None:
                raise _invalid(name, kind, value)
            ms = float(match.group(1)) * _UNITS_MS[match.group(2)]
        elif isinstance(value, datetime.timedelta):
            ms = value.total_seconds() * 1000
        else:
            ms = float(value) * 1000
    except OverflowError:  # an int too large for a float (10**400)
        raise _invalid(name, kind, value) from None
    if not math.isfinite(ms):
        raise _invalid(name, kind, value)
    return ms


def _bounds(minimum_ms: int, maximum_ms: int) -> str:
    if minimum_ms <= 0:
        return f"a non-negative duration of at most {_ms(maximum_ms)}"
    if minimum_ms == 1:
        return f"a positive duration of at most {_ms(maximum_ms)}"
    return f"a positive duration of at least {_ms(minimum_ms)} and at most {_ms(maximum_ms)}"


def _ms(ms: int) -> str:
    if ms % 86_400_000 == 0:
        return f"{ms // 86_400_000} days"
    if ms % 1000 == 0:
        return f"{ms // 1000}s"
    return f"{ms}ms"


def _message(name: str, kind: str, value: object) -> str:
    if isinstance(value, int) and value.bit_length() > 1000:
        shown = f"an int of {value.bit_length()} bits"  # repr() refuses past 4300 digits
    else:
        shown = repr(value)
    if len(shown) > 80:
        shown = shown[:60] + "..." + shown[-10:]
    return f"`{name}` must be {kind} ({_RULE}), got {shown}"


def _invalid(name: str, kind: str, value: object) -> ValueError:
    return ValueError(_message(name, kind, value))
