"""The ``DatabaseStore`` following a promoted standby (SPEC section 15): a real primary and its
streaming standby (tests/servers/pg_standby.py), an alias naming both hosts with
``target_session_attrs=read-write``, the primary SIGKILLed and the standby promoted with
``pg_ctl promote``, twice. With synchronous replication the held lease and the token sequence
are on the new primary: the holder keeps its lock, tokens grow, and a waiter is woken by the
release (the ``LISTEN`` session, or its polling fallback, following the switch too)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connections

from django_locks import Locks
from django_locks.exceptions import StoreError
from django_locks.stores.database import DatabaseStore

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

ALIAS = "failover"


@pytest.fixture(params=[True, False], ids=["synchronous", "asynchronous"])
def pair(request: pytest.FixtureRequest, django_db_blocker: Any) -> Iterator[Any]:
    """The servers, and the alias ``failover`` naming both, migrated. Outside Django's test
    cases (which refuse an alias they were not told of), database access unblocked."""
    from tests.servers import missing
    from tests.servers.pg_standby import StandbyPair

    try:
        servers = StandbyPair(synchronous=request.param)
    except (OSError, RuntimeError) as exc:
        missing(f"a PostgreSQL primary and standby did not start: {exc}")
    unblocked = django_db_blocker.unblock()
    unblocked.__enter__()
    entry = servers.database_settings()
    # Fills in the defaults, in place (connections.settings is settings.DATABASES itself).
    connections.configure_settings({"default": settings.DATABASES["default"], ALIAS: entry})
    settings.DATABASES[ALIAS] = entry
    try:
        call_command("migrate", "django_locks", database=ALIAS, verbosity=0)
        connections[ALIAS].close()
        yield servers
    finally:
        connections[ALIAS].close()
        del connections[ALIAS]  # the wrapper keeps these servers' ports
        del settings.DATABASES[ALIAS]
        servers.destroy()
        unblocked.__exit__(None, None, None)


def until_answered(call: Any, seconds: float = 30.0) -> Any:
    """``call()``, retried while the store raises ``StoreError`` (the failover's gap)."""
    until = time.monotonic() + seconds
    while True:
        try:
            return call()
        except StoreError:
            if time.monotonic() > until:
                raise
            time.sleep(0.05)


def test_the_store_and_its_waiters_follow_a_promoted_standby(pair: Any) -> None:
    store = DatabaseStore(ALIAS, timeout=2)
    service = Locks(store, ttl="20s")
    try:
        held = service.acquire("failover:held")
        assert held is not None
        tokens = [held.fencing_token]
        for _ in range(2):
            pair.failover()
            promoted = time.monotonic()
            fresh = until_answered(lambda: service.acquire("failover:fresh"))
            followed = time.monotonic() - promoted
            assert fresh is not None, "a free key is granted by the new primary"
            tokens.append(fresh.fencing_token)
            fresh.release()
            print(f"answered {followed:.2f} s after the promotion")
            assert followed < 15, followed
            if pair.synchronous:
                # What a commit answered is on the standby before the answer: the holder's
                # lease, renewed by the new primary.
                lease = store.lease("failover:held")
                assert lease is not None and lease.owner == held.owner
                assert until_answered(lambda: store.renew("failover:held", held.owner, 20_000))
            pair.rejoin()
        assert tokens == sorted(set(tokens)), f"tokens grow across promotions: {tokens}"
        if not pair.synchronous:
            return
        assert held.held and not held.signal.aborted
        woken: list[float] = []

        def wait_for_it() -> None:
            lock = service.acquire("failover:held", wait=20)
            if lock is not None:
                woken.append(time.monotonic())
                lock.release()

        waiter = threading.Thread(target=wait_for_it)
        waiter.start()
        time.sleep(1.0)  # the waiter is waiting, through the new primary
        released = time.monotonic()
        held.release()
        waiter.join(25)
        assert woken and woken[0] - released < 5.0, (woken, released)
    finally:
        store.close()
