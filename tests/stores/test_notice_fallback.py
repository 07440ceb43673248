"""A waiting acquire outlives the notice channel: PostgreSQL's LISTEN session, Redis's BLPOP.

While the channel is down (its session terminated again and again) waiters sleep through their
backoff and still get the key when the holder releases; once it is back they are woken by
notices again. Real servers; the channel is killed from the server side, as an operator, an
``idle_session_timeout`` or a proxy would.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connections

from django_locks.lock import Lock
from django_locks.service import Locks
from django_locks.stores.base import LockStore
from tests.helpers import eventually

RELEASE_AFTER = 1.5
"""Seconds the holder keeps the key while the waiter's notice channel is being killed."""


def name() -> str:
    return f"fallback:{uuid.uuid4().hex[:10]}"


def wait_through_kills(locks: Locks, kill: Callable[[], int], *, until: float = 2.5) -> Lock:
    """The holder releases RELEASE_AFTER seconds into a waiter's ``acquire(wait="8s")`` while
    ``kill()`` kills the waiter's notice channel every 50 ms for ``until`` seconds; returns the
    waiter's lock (the test fails on its error)."""
    key = name()
    holder = locks.acquire(key)
    assert holder is not None
    got: list[Any] = []

    def waiter() -> None:
        try:
            got.append(locks.acquire(key, wait="8s"))
        except BaseException as exc:
            got.append(exc)

    thread = threading.Thread(target=waiter)
    thread.start()
    started = time.monotonic()
    kills = 0
    released = None
    while time.monotonic() - started < until and not got:
        kills += kill()
        if released is None and time.monotonic() - started >= RELEASE_AFTER:
            holder.release()
            released = time.monotonic()
        time.sleep(0.05)
    thread.join(10)
    assert released is not None, got
    assert kills >= 2, "the notice channel was never killed: the test shows nothing"
    [lock] = got
    assert isinstance(lock, Lock), lock
    # Within the backoff's cap (1 s) and a margin of the released key.
    assert time.monotonic() - released < 2.5
    return lock


def handoff(locks: Locks) -> float:
    """Seconds from a release to the acquire of a thread that had waited 1.5 s (its backoff
    then is 0.5 to 1 s: a waiter woken by the notice gets the key long before that)."""
    key = name()
    holder = locks.acquire(key)
    assert holder is not None
    got: list[float] = []
    thread = threading.Thread(
        target=lambda: got.append(time.monotonic()) if locks.acquire(key, wait="8s") else None
    )
    thread.start()
    time.sleep(1.5)
    released = time.monotonic()
    holder.release()
    thread.join(10)
    assert got
    return got[0] - released


def assert_fast_handoffs(locks: Locks) -> None:
    took = sorted(handoff(locks) for _ in range(3))
    # Woken by notices: the backoff alone would give about 0.5 to 1 s (its upper half, jittered).
    assert took[1] < 0.25, took


# PostgreSQL: the LISTEN session terminated with pg_terminate_backend.


@pytest.fixture
def pg_locks() -> Iterator[Locks]:
    from django_locks.stores.database import DatabaseStore

    store = DatabaseStore("postgres")
    yield Locks(store, ttl="10s")
    store.close()


@pytest.fixture
def sql(postgres_server: Any) -> Iterator[Any]:
    conn = postgres_server.connect(connections["postgres"].settings_dict["NAME"])
    yield conn
    conn.close()


def terminate_listeners(sql: Any) -> int:
    """Terminate every LISTEN session on the test database; how many there were."""
    cursor = sql.cursor()
    cursor.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND query LIKE 'LISTEN %%'"
    )
    return len(cursor.fetchall())


def listening(store: LockStore) -> bool:
    listener = getattr(store, "_listener", None)
    return bool(listener is not None and listener._listening)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
def test_a_waiter_outlives_its_listen_session_terminated_again_and_again(
    pg_locks: Locks, sql: Any, caplog: pytest.LogCaptureFixture
) -> None:
    store = pg_locks.store
    assert not store.wait_for_release(name(), 0.5)  # the listener connects
    eventually(lambda: listening(store), timeout=10, what="the listener listens")
    with caplog.at_level(logging.DEBUG, logger="django_locks"):
        wait_through_kills(pg_locks, lambda: terminate_listeners(sql)).release()
    assert "Listening for release notices on 'postgres' failed" in caplog.text
    # The session comes back by itself; waiters are woken by notices again.
    eventually(lambda: listening(store), timeout=10, what="the listener listens again")
    assert "Release notices on 'postgres' are back" in caplog.text
    assert_fast_handoffs(pg_locks)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
def test_a_wait_while_the_session_is_down_is_no_notice_not_an_error(
    pg_locks: Locks, sql: Any
) -> None:
    store = pg_locks.store
    assert not store.wait_for_release(name(), 0.5)
    eventually(lambda: listening(store), timeout=10, what="the listener listens")
    assert terminate_listeners(sql) == 1
    eventually(lambda: not listening(store), timeout=5, what="the listener saw it")
    started = time.monotonic()
    assert store.wait_for_release(name(), 0.3) is False
    assert 0.25 < time.monotonic() - started < 1.0  # it waited its timeout, it did not spin


# Redis: the connection a waiter blocks on in BLPOP killed with CLIENT KILL.


@pytest.fixture
def redis_locks(redis_server: Any) -> Iterator[Locks]:
    from django_locks.stores.redis import RedisStore

    store = RedisStore(url=redis_server.url, prefix=f"t{uuid.uuid4().hex[:8]}")
    yield Locks(store, ttl="10s")
    store.close()


def kill_blocked(client: Any) -> int:
    """``CLIENT KILL ID`` every connection blocked in BLPOP; how many there were."""
    blocked = [c for c in client.client_list() if c.get("cmd") == "blpop"]
    for connection in blocked:
        client.execute_command("CLIENT", "KILL", "ID", connection["id"])
    return len(blocked)


@pytest.mark.redis
def test_a_waiter_outlives_its_blpop_connection_killed_again_and_again(
    redis_locks: Locks, redis_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with redis_server.client() as client, caplog.at_level(logging.DEBUG, logger="django_locks"):
        wait_through_kills(redis_locks, lambda: kill_blocked(client)).release()
    assert_fast_handoffs(redis_locks)


@pytest.mark.redis
def test_a_waiter_outlives_client_kill_type_normal(redis_locks: Locks, redis_server: Any) -> None:
    killed_all: list[int] = []
    with redis_server.client() as client:

        def kill() -> int:
            if killed_all or not any(c.get("cmd") == "blpop" for c in client.client_list()):
                return kill_blocked(client)
            # Once, while the waiter blocks: TYPE normal also kills the store's idle connections
            # (they reconnect); again and again it would also cut calls of the acquire itself
            # in the middle, a store error of their own.
            killed_all.append(client.execute_command("CLIENT", "KILL", "TYPE", "normal"))
            return int(killed_all[0])

        wait_through_kills(redis_locks, kill).release()
    assert killed_all and killed_all[0] >= 2  # the waiter's and the store's idle connections
    assert_fast_handoffs(redis_locks)


@pytest.mark.redis
def test_a_server_that_cannot_be_reached_still_fails_the_acquire(redis_server: Any) -> None:
    from django_locks.exceptions import StoreError
    from django_locks.stores.redis import RedisStore

    store = RedisStore(url="redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
    started = time.monotonic()
    assert store.wait_for_release(name(), 0.3) is False  # no notice, no error: it waited
    assert time.monotonic() - started >= 0.25
    with pytest.raises(StoreError):
        Locks(store, ttl="10s").acquire(name(), wait="1s")
