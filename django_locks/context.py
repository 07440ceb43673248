"""``current_lock()``: the lock of the block or job being run, kept in a context variable.

A ``contextvars.ContextVar`` follows asyncio tasks and threads started with
``contextvars.copy_context().run``.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from django_locks.lock import Lock

_current: contextvars.ContextVar[Lock | None] = contextvars.ContextVar(
    "django_locks_current_lock", default=None
)


def current_lock() -> Lock | None:
    """The lock of the ``lock()`` / ``with_lock()`` block or decorated job being run, or None."""
    return _current.get()


@contextlib.contextmanager
def running_under(lock: Lock) -> Iterator[None]:
    """Make ``lock`` the current lock for the duration of the block."""
    token = _current.set(lock)
    try:
        yield
    finally:
        _current.reset(token)
