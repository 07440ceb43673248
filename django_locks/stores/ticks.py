"""Tick records (:meth:`~django_locks.stores.base.LockStore.record_tick`): what every store checks
before any I/O."""

from __future__ import annotations

MAX_TICK_MS = 9_223_372_036_854_775_807  # 2 to the 63rd, less one
"""The latest tick a store records (the database store's ``bigint`` column), in milliseconds since
the Unix epoch: some 292 million years from now."""


def check_tick_ms(tick_ms: object) -> int:
    """``tick_ms`` of :meth:`~django_locks.stores.base.LockStore.record_tick`, checked: an ``int``
    (never a ``bool``) of milliseconds since the Unix epoch, 0 to :data:`MAX_TICK_MS`; any other
    value raises ``ValueError`` naming the argument, before the store does any I/O."""
    if isinstance(tick_ms, bool) or not isinstance(tick_ms, int) or not 0 <= tick_ms <= MAX_TICK_MS:
        raise ValueError(
            f"`tick_ms` must be an int of 0 or more (milliseconds since the Unix epoch, at most "
            f"2**63 - 1), got {tick_ms!r}"
        )
    return tick_ms
