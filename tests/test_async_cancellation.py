"""Async blocks cancelled at any instant leave nothing held; releases bounded by the validity;
async waiters woken by release notices. On every store (SPEC sections 2 and 10)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_locks import Locks, locks, without_overlapping
from django_locks.decorators import release_owner_leases
from django_locks.exceptions import LockNotAcquiredError, StoreTimeoutError
from django_locks.notices import NOTICE_SLICE
from django_locks.renewal import held_keepers
from django_locks.stores import InMemoryStore
from django_locks.stores.base import LockStore, Renewed
from tests.helpers import eventually

STORES = [
    pytest.param("memory", id="memory"),
    pytest.param("sqlite", marks=pytest.mark.django_db(transaction=True), id="sqlite"),
    pytest.param(
        "postgres",
        marks=[
            pytest.mark.postgres,
            pytest.mark.django_db(transaction=True, databases=["default", "postgres"]),
        ],
        id="postgres",
    ),
    pytest.param("redis", marks=pytest.mark.redis, id="redis"),
]
NOTIFYING = [param for param in STORES if param.values[0] in ("memory", "postgres", "redis")]


def build_store(kind: str, request: pytest.FixtureRequest) -> LockStore:
    if kind == "memory":
        return InMemoryStore()
    from django_locks.stores.database import DatabaseStore

    if kind == "sqlite":
        return DatabaseStore("default")
    if kind == "postgres":
        return DatabaseStore("postgres")
    from django_locks.stores.redis import RedisStore

    server = request.getfixturevalue("redis_server")
    return RedisStore(url=server.url, prefix=f"c{uuid.uuid4().hex[:8]}")


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> Iterator[LockStore]:
    made = build_store(request.param, request)
    yield made
    made.close()


@pytest.fixture(params=NOTIFYING)
def notifying_store(request: pytest.FixtureRequest) -> Iterator[LockStore]:
    made = build_store(request.param, request)
    yield made
    made.close()


def prefix() -> str:
    return f"cancel:{uuid.uuid4().hex[:8]}:"


def assert_nothing_held(service: Locks, keys: list[str]) -> None:
    """No lease of ``keys`` left in the store (each acquired at once) and no keeper renewing."""

    def store_free() -> bool:
        names = {lease.key for lease in service.store.leases()}
        return not names.intersection(keys)

    # A cancelled acquire hands back what it got from a thread of its own, just after.
    eventually(store_free, timeout=5, what="every lease released in the store")
    assert not [k for k in held_keepers() if k.key in keys], "a keeper is still renewing"
    for key in keys:
        lock = service.acquire(key)
        assert lock is not None, f"{key!r} stayed held"
        lock.release()


TINY = [0.0001, 0.0002, 0.0005, 0.001, 0.0015, 0.002, 0.003, 0.005]


def test_wait_for_with_tiny_timeouts_leaves_nothing_held(store: LockStore) -> None:
    service = Locks(store, ttl="10s")
    keys = [prefix() + str(n) for n in range(3)]
    timed_out = 0

    async def block(key: str) -> None:
        async with service.alock(key, wait="5s"):
            await asyncio.sleep(0.001)  # so that the sweep's timeouts fall on every phase

    async def main() -> None:
        nonlocal timed_out
        for iteration in range(400):
            try:
                await asyncio.wait_for(block(keys[iteration % 3]), TINY[iteration % len(TINY)])
            except TimeoutError:
                timed_out += 1

    asyncio.run(main())
    assert timed_out > 40  # the sweep did cancel blocks
    assert_nothing_held(service, keys)


def test_cancelled_at_random_instants_of_acquire_body_and_exit(store: LockStore) -> None:
    service = Locks(store, ttl="10s")
    keys = [prefix() + str(n) for n in range(2)]
    rng = random.Random(15)
    phases = {"acquire": 0, "body": 0, "exit": 0, "done": 0}

    async def block(key: str, body: float, phase: list[str]) -> None:
        async with service.alock(key, wait="5s"):
            phase[0] = "body"
            if body:
                await asyncio.sleep(body)
            phase[0] = "exit"
        phase[0] = "done"

    async def one(key: str, body: float) -> float:
        started = time.perf_counter()
        await block(key, body, ["acquire"])
        return time.perf_counter() - started

    async def main() -> None:
        # One block's duration on this store, so that cancellation instants cover all of it.
        span = statistics.median([await one(keys[0], 0) for _ in range(20)]) * 1.5
        for _ in range(300):
            phase = ["acquire"]
            body = rng.choice([0, 0, span / 4])
            task = asyncio.create_task(block(rng.choice(keys), body, phase))
            await asyncio.sleep(rng.uniform(0, span + body))
            seen = phase[0]
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            except LockNotAcquiredError:
                pytest.fail("a block waited 5s for a key nobody held")
            phases[seen] += 1

    asyncio.run(main())
    assert_nothing_held(service, keys)
    # The instants reached every phase (the exit is the shortest: a few are enough).
    assert phases["acquire"] >= 5 and phases["body"] >= 5 and phases["exit"] >= 3, phases


def test_a_block_cancelled_while_leaving_has_released_when_the_task_ends() -> None:
    store = SlowRelease(InMemoryStore(), delay=0.3)
    service = Locks(store)

    async def main() -> None:
        async def block() -> None:
            async with service.alock("k"):
                pass

        task = asyncio.create_task(block())
        await asyncio.to_thread(store.releasing.wait, 5)
        task.cancel()
        task.cancel()  # a second cancellation changes nothing
        started = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - started > 0.1  # it waited for the store's answer...
        assert store.inner.leases() == []  # ...so the key is free as the task ends
        # (Only this store's: a lock another test of the process still holds is not ours.)
        assert not [keeper for keeper in held_keepers() if keeper.store is store]

    asyncio.run(main())


class SlowRelease(LockStore):
    """A real in-memory store whose release is answered ``delay`` seconds late (a slow
    network): ``releasing`` is set when a release reaches it."""

    def __init__(self, inner: LockStore, delay: float) -> None:
        self.inner = inner
        self.delay = delay
        self.releasing = threading.Event()

    def acquire(self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None) -> Any:
        return self.inner.acquire(key, owner, ttl_ms, timeout=timeout)

    def renew(self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None) -> Renewed:
        return self.inner.renew(key, owner, ttl_ms, timeout=timeout)

    def release(self, key: str, owner: str, *, timeout: float | None = None) -> bool:
        self.releasing.set()
        time.sleep(self.delay)
        return self.inner.release(key, owner, timeout=timeout)

    def leases(self, *, include_inactive: bool = False) -> Any:
        return self.inner.leases(include_inactive=include_inactive)


@without_overlapping("cancel:job")
async def exclusive_job() -> str:
    await asyncio.sleep(0)
    return "ran"


@pytest.mark.usefixtures("locks_reset")
def test_an_async_job_cancelled_while_leaving_does_not_make_the_next_run_skip(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release_owner_leases()
    store = locks.store
    real_release = store.end
    releasing = threading.Event()

    def slow_release(*args: Any, **kwargs: Any) -> bool:
        releasing.set()
        time.sleep(0.2)  # the store answers late: the task is cancelled meanwhile
        return real_release(*args, **kwargs)

    async def main() -> None:
        for _ in range(3):
            releasing.clear()
            monkeypatch.setattr(store, "end", slow_release)
            task = asyncio.create_task(exclusive_job())
            await asyncio.to_thread(releasing.wait, 5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            monkeypatch.setattr(store, "end", real_release)
            assert await exclusive_job() == "ran"  # not skipped: the key is free

    asyncio.run(main())


# Releases bounded by the lock's validity (SPEC section 10), on a hung server.


@pytest.mark.redis
def test_a_release_on_a_hung_redis_returns_within_the_validity(make_redis_server: Any) -> None:
    from django_locks.stores.redis import RedisStore

    server = make_redis_server()
    service = Locks(RedisStore(url=server.url), ttl="1s")  # the store's own default is 5s
    pid = server.process.pid

    def hung_release() -> Callable[[], Any]:
        lock = service.acquire("direct")
        assert lock is not None
        return lock.release

    release = hung_release()
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(StoreTimeoutError):
            release()  # a direct release still raises
        assert time.monotonic() - started < 1.5
        os.kill(pid, signal.SIGCONT)
        started = time.monotonic()
        assert service.with_lock("block", lambda: stop_and_answer(pid)) == 42
        assert time.monotonic() - started < 1.5

        async def block() -> int:
            async with service.alock("async-block"):
                stop_and_answer(pid)
                return 42

        os.kill(pid, signal.SIGCONT)
        started = time.monotonic()
        assert asyncio.run(block()) == 42
        assert time.monotonic() - started < 1.5
    finally:
        os.kill(pid, signal.SIGCONT)
        service.store.close()


def stop_and_answer(pid: int) -> int:
    os.kill(pid, signal.SIGSTOP)
    return 42


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
def test_a_release_on_a_hung_postgres_backend_returns_within_the_validity(caplog: Any) -> None:
    from django_locks.stores.database import DatabaseStore
    from tests.stores.test_postgres import backend_pid

    store = DatabaseStore("postgres")
    service = Locks(store, ttl="1s")
    stopped: list[int] = []

    def stop_own_backend() -> int:
        stopped.append(backend_pid(store))  # this thread's connection, which releases
        os.kill(stopped[-1], signal.SIGSTOP)
        return 42

    try:
        started = time.monotonic()
        assert service.with_lock("pg-block", stop_own_backend) == 42
        assert time.monotonic() - started < 1.5
        assert "Releasing lock 'pg-block' failed" in caplog.text
        assert "lapses within its ttl of 1s" in caplog.text
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        store.close()


# Async waiters woken by the store's release notices.


def test_an_async_waiter_is_woken_by_a_release_notice(notifying_store: LockStore) -> None:
    service = Locks(notifying_store, ttl="10s")
    key = prefix() + "notice"
    handoffs: list[float] = []

    async def main() -> None:
        for _ in range(3):
            holder = service.acquire(key)
            assert holder is not None
            released = [0.0]

            def release_later(lock: Any = holder, released: list[float] = released) -> None:
                time.sleep(1.5)  # the waiter's backoff is at its cap by now (0.5s to 1s)
                released[0] = time.perf_counter()
                lock.release()

            threading.Thread(target=release_later, daemon=True).start()
            lock = await service.aacquire(key, wait="10s")
            handoffs.append(time.perf_counter() - released[0])
            assert lock is not None
            await lock.arelease()

    asyncio.run(main())
    # Sleeping through its backoff, a waiter would take 0.375s on average (0 to 1s).
    assert max(handoffs) < 0.15, handoffs


def test_many_async_waiters_do_not_exhaust_the_default_executor() -> None:
    service = Locks(InMemoryStore(), ttl="10s")
    keys = [prefix() + str(n) for n in range(40)]

    async def main() -> None:
        holders = [service.acquire(key) for key in keys]
        waiters = [
            asyncio.create_task(service.aacquire(key, wait="10s")) for key in keys for _ in (0, 1)
        ]
        await asyncio.sleep(0.3)
        started = time.perf_counter()
        assert await asyncio.get_running_loop().run_in_executor(None, lambda: 42) == 42
        assert time.perf_counter() - started < 0.1  # no executor thread is stuck waiting
        for holder in holders:
            assert holder is not None
            holder.release()
        # One waiter of each key gets it (those of keys beyond WATCH_THREADS at their backoff).
        got: list[Any] = []
        give_up = time.monotonic() + 5
        while len(got) < len(keys) and time.monotonic() < give_up:
            done, _ = await asyncio.wait(
                [w for w in waiters if not w.done()], timeout=0.1, return_when="FIRST_COMPLETED"
            )
            got += [waiter.result() for waiter in done]
        assert sorted(lock.key for lock in got) == sorted(keys)
        for waiter in waiters:
            waiter.cancel()  # the other waiter of each key
        await asyncio.gather(*waiters, return_exceptions=True)
        for lock in got:
            await lock.arelease()

    asyncio.run(main())
    assert_nothing_held(service, keys)
    # Nobody waits any more: the threads waiting for notices stop within one slice.
    eventually(lambda: not service._notices._rooms, timeout=NOTICE_SLICE + 1, what="idle")


def test_an_async_wait_falls_back_to_its_backoff_when_notices_fail() -> None:
    store = FailingNotices()
    service = Locks(store, ttl="10s")

    async def main() -> None:
        holder = service.acquire("k")
        assert holder is not None
        asyncio.get_running_loop().call_later(0.2, holder.release)
        started = time.monotonic()
        lock = await service.aacquire("k", wait="5s")
        assert lock is not None and time.monotonic() - started < 2
        await lock.arelease()

    asyncio.run(main())
    assert store.waits > 0


class FailingNotices(InMemoryStore):
    """An in-memory store whose notice channel is down."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait_for_release(self, key: str, timeout: float) -> bool:
        from django_locks.exceptions import StoreError

        self.waits += 1
        raise StoreError("the notice channel is down (injected)")
