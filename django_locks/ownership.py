"""Owner leases held by this process: the sticky leases of plain functions, kept until exit."""

from __future__ import annotations

import atexit
import logging
import threading

from django_locks.lock import Lock

logger = logging.getLogger("django_locks")

_sticky: dict[str, Lock] = {}
_sticky_mutex = threading.Lock()
_atexit_registered = False


def owned(key: str) -> Lock | None:
    """The sticky lease on ``key`` if this process still holds it: no store call."""
    lock = _sticky.get(key)
    return lock if lock is not None and lock.held else None


def keep(name: str, key: str, lock: Lock) -> None:
    """Keep ``lock`` as the sticky owner lease of the job ``name`` until exit (or until lost)."""
    global _atexit_registered
    with _sticky_mutex:
        _sticky[key] = lock
        if not _atexit_registered:
            atexit.register(release_owner_leases)
            _atexit_registered = True
    log_owner(name, lock)


def release_owner_leases() -> None:
    """Hand back every sticky owner lease this process holds (at exit, or in tests)."""
    with _sticky_mutex:
        held = list(_sticky.values())
        _sticky.clear()
    for lock in held:
        try:
            lock.release()
        except Exception as exc:  # at exit even spawning may fail: every other lease goes on
            logger.warning("Handing back %r failed (%s); it lapses at its ttl", lock.key, exc)


def log_owner(name: str, lock: Lock) -> None:
    """Log that the job ``name`` runs here, under ``lock``."""
    logger.info(
        "%s runs on this instance (lease %r, fencing token %s)",
        name,
        lock.key,
        lock.fencing_token,
    )
