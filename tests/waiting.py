"""The one polling helper, ``eventually``: stdlib only, so the server modules can use it too."""

from __future__ import annotations

import time
from collections.abc import Callable


def eventually(
    predicate: Callable[[], object],
    *,
    timeout: float = 10.0,
    what: str | Callable[[], str] = "",
    every: float = 0.005,
    ignoring: tuple[type[BaseException], ...] = (),
) -> float:
    """Poll until ``predicate()`` is true; return the seconds it took.

    Fails with AssertionError naming ``what`` once ``timeout`` seconds have passed (a callable
    ``what`` is asked then: a child's output so far). ``every`` is the sleep between polls; an
    exception of a type in ``ignoring`` counts as "not yet" (a server still starting refuses in
    many ways).
    """
    start = time.monotonic()
    while True:
        try:
            if predicate():
                return time.monotonic() - start
        except ignoring:
            pass
        if time.monotonic() - start > timeout:
            said = what() if callable(what) else what
            raise AssertionError(f"not true after {timeout:g}s: {said or predicate}")
        time.sleep(every)
