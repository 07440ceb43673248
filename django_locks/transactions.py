"""Whether a release happens inside the code's own ``transaction.atomic()`` (and the warning)."""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

from django.db.backends.signals import connection_created

logger = logging.getLogger("django_locks")


def warn_if_in_atomic(key: str) -> None:
    """Warn that releasing ``key`` now lets the next holder in before this thread's open
    transaction commits (SPEC section 7); silent outside one, and inside a ``TestCase``'s own."""
    if _in_atomic_block():
        logger.warning(
            "Lock %r is released inside transaction.atomic(): the next holder can run before "
            "this transaction's writes are committed. Take the lock outside the transaction "
            "(wrap the atomic block in the lock, not the other way round), or pass "
            'release="on_commit" to lock(), with_lock() or the decorators: it is then '
            "released once the transaction commits (at once when it rolls back).",
            key,
        )


# The database connections this thread opened, kept as Django's `connection_created` announces
# them: asking `connections` for them costs microseconds per alias and release, and an atomic
# block always runs on a connection its thread opened (Django's connections are thread-local).
_opened = threading.local()


def _remember_connection(sender: object, connection: Any, **kwargs: object) -> None:
    opened = _opened.__dict__.get("wrappers")
    if opened is None:
        opened = _opened.wrappers = []
    _remember(opened, connection)


def _remember(opened: list[weakref.ref[Any]], connection: Any) -> None:
    # Weak references in a plain list: read on every release, where iterating a WeakSet (its
    # iteration guard, in Python) costs more than the check itself. A thread opens a handful
    # of connections (one per alias, again after each close): the dead ones are dropped here.
    opened[:] = [ref for ref in opened if (conn := ref()) is not None and conn is not connection]
    opened.append(weakref.ref(connection))


connection_created.connect(_remember_connection, weak=False, dispatch_uid="django_locks")


def _in_atomic_block() -> bool:
    """Whether this thread is inside a real ``transaction.atomic()`` block on any alias.

    The wrapping transactions of Django's ``TestCase`` do not count: a test that takes and
    releases a lock is not the mistake the warning is about (SPEC section 7)."""
    opened = _opened.__dict__.get("wrappers")
    if opened is None:
        opened = _seed_opened()
    for ref in opened:
        conn = ref()
        if conn is not None and conn.in_atomic_block and _real_atomic(conn):
            return True
    return False


def _seed_opened() -> list[weakref.ref[Any]]:
    # Connections this thread opened before this module was imported sent `connection_created`
    # to nobody: take them from Django once per thread (a project without Celery and without
    # the admin may import django_locks.lock, and so this module, only on its first lock).
    from django.db import connections

    opened: list[weakref.ref[Any]] = []
    _opened.wrappers = opened
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None:
            _remember(opened, conn)
    return opened


def _real_atomic(conn: Any) -> bool:
    """Whether one of ``conn``'s open atomic blocks is the code's own, not a TestCase's."""
    return any(not getattr(block, "_from_testcase", False) for block in conn.atomic_blocks)


def testcase_only(conn: Any) -> bool:
    """Whether ``conn``'s open atomic blocks are all a ``TestCase``'s own (none is the code's)."""
    return conn.in_atomic_block and not _real_atomic(conn)


def atomic_aliases() -> list[str]:
    """The aliases this thread is inside a real ``transaction.atomic()`` block on (not counting
    a ``TestCase``'s wrapping ones), in the order their connections were opened."""
    opened = _opened.__dict__.get("wrappers")
    if opened is None:
        opened = _seed_opened()
    aliases: list[str] = []
    for ref in opened:
        conn = ref()
        alias = None if conn is None or not conn.in_atomic_block else conn.alias
        if alias is not None and alias not in aliases and _real_atomic(conn):
            aliases.append(alias)
    return aliases
