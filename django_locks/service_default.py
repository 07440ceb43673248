"""``DefaultLocks``: the service ``django_locks.locks`` is, built from the ``LOCKS`` setting on
first use and rebuilt when it changes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.utils.functional import LazyObject, empty

from django_locks.stores.base import LockStore

if TYPE_CHECKING:
    from django_locks.service import Locks


class DefaultLocks(LazyObject):  # type: ignore[type-arg]
    """The ``Locks`` configured from the ``LOCKS`` setting, built on first use and rebuilt when
    the setting changes (``override_settings``)."""

    _wrapped: object

    def _setup(self) -> None:
        self._wrapped = _from_settings()

    def _reset(self) -> None:
        wrapped = self._wrapped
        self._wrapped = empty
        from django_locks.service import Locks

        if isinstance(wrapped, Locks):
            wrapped.store.close()


def _from_settings() -> Locks:
    """The service ``LOCKS`` describes: conf reads the setting and builds the store, the
    service puts them together (conf never builds nor resets a service)."""
    from django_locks import conf
    from django_locks.service import Locks

    config = conf.get()
    store = conf.build_store(config)
    clock = config.clock
    # A ManualClock in LOCKS["CLOCK"] moves a server store's leases with it (warp(), SPEC
    # section 7); a store that takes the clock (the in-memory one) was given it instead.
    attach = getattr(clock, "attach", None)
    if (
        attach is not None
        and not conf.takes_clock(config.backend)
        and type(store).warp is not LockStore.warp
    ):
        attach(store)
    # The ttl in the milliseconds it was validated to, not through seconds and back.
    max_hold = None if config.max_hold_ms is None else f"{config.max_hold_ms}ms"
    return Locks(
        store,
        ttl=f"{config.ttl_ms}ms",
        clock=clock,
        key_prefix=config.key_prefix,
        max_hold=max_hold,
    )
