"""Waiting for a store's release notice: the one loop threads wait in (a campaign's follower,
an acquire's pause between tries)."""

# Below the service and the ownership module, which both wait in it (coroutines wait through
# ``aio.ReleaseNotices``: one watching thread per key, whatever the number of waiters).

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from django_locks.exceptions import StoreError

if TYPE_CHECKING:
    from django_locks.abort import AbortSignal
    from django_locks.stores.base import LockStore

logger = logging.getLogger("django_locks")

Notice = Literal["released", "waited", "no notices"]

NOTICE_SLICE = 0.25
"""Seconds of one wait for a store's release notice, between checks for a stop."""


def wait_for_release(
    store: LockStore,
    key: str,
    until: float,
    *,
    stop: threading.Event | AbortSignal | None = None,
    monotonic: Callable[[], float] = time.monotonic,
) -> Notice:
    """Wait until ``until`` (``monotonic``'s seconds) for ``store``'s notice that ``key`` was
    released, returning early when ``stop`` is set (an event) or aborts (a signal).

    ``"released"``: a notice came. ``"waited"``: the time passed, or ``stop`` came first.
    ``"no notices"``: the store sends none; the rest of the time was slept (``stop`` still
    ends it early). A failing notice channel is not the store failing: its slice is slept, the
    next slice waits for a notice again.
    """
    while not _stopped(stop):
        remaining = until - monotonic()
        if remaining <= 0:
            return "waited"
        # Slices keep a stop noticed within NOTICE_SLICE while the store waits.
        slice_ = min(NOTICE_SLICE, remaining)
        try:
            if store.wait_for_release(key, slice_):
                return "released"
        except NotImplementedError:
            _sleep(stop, remaining)
            return "no notices"
        except StoreError as exc:
            logger.debug("Waiting for a release notice of %r failed: %s", key, exc)
            _sleep(stop, slice_)
    return "waited"


def _stopped(stop: threading.Event | AbortSignal | None) -> bool:
    if stop is None:
        return False
    return stop.is_set() if isinstance(stop, threading.Event) else stop.aborted


def _sleep(stop: threading.Event | AbortSignal | None, seconds: float) -> None:
    if stop is None:
        time.sleep(max(seconds, 0.0))
    else:
        stop.wait(max(seconds, 0.0))
