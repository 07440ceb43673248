"""Arguments every store checks before any I/O (the contract's rules, once)."""

from __future__ import annotations


def check_older_than(older_than_ms: object) -> int:
    """``older_than_ms`` of :meth:`LockStore.prune`, checked: an ``int`` of 0 or more."""
    if isinstance(older_than_ms, bool) or not isinstance(older_than_ms, int):
        raise TypeError(f"`older_than_ms` must be an int of milliseconds, got {older_than_ms!r}")
    if older_than_ms < 0:
        raise ValueError(f"`older_than_ms` must be 0 or more, got {older_than_ms!r}")
    return older_than_ms
