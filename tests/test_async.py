"""The async twins: aacquire, alock, awith_lock, arelease; cancellation; a free event loop."""

from __future__ import annotations

import asyncio
import time

import pytest

from django_locks import AbortSignal, LockNotAcquiredError, Locks, current_lock
from django_locks.stores import InMemoryStore
from tests.helpers import FaultyStore, eventually


@pytest.fixture
def service() -> Locks:
    return Locks(InMemoryStore(), ttl="30s")


def test_aacquire_and_arelease(service: Locks) -> None:
    async def main() -> None:
        lock = await service.aacquire("k")
        assert lock is not None and lock.held
        assert await service.aacquire("k") is None
        assert await lock.arelease() is True
        again = await service.aacquire("k")
        assert again is not None and again.fencing_token > lock.fencing_token

    asyncio.run(main())


def test_alock_sets_current_lock_and_releases_on_exceptions(service: Locks) -> None:
    async def main() -> None:
        with pytest.raises(ValueError):
            async with service.alock("k") as lock:
                assert current_lock() is lock
                raise ValueError
        assert current_lock() is None and not lock.held
        assert await service.awith_lock("k", _answer) == 42
        holder = await service.aacquire("k")
        with pytest.raises(LockNotAcquiredError):
            await service.awith_lock("k", _answer, wait="100ms")
        assert holder is not None

    asyncio.run(main())


async def _answer() -> int:
    return 42


def test_waiting_does_not_block_the_event_loop(service: Locks) -> None:
    async def main() -> None:
        holder = await service.aacquire("k")
        assert holder is not None
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticking = asyncio.create_task(ticker())
        asyncio.get_running_loop().call_later(0.3, holder.release)
        lock = await service.aacquire("k", wait="5s")
        ticking.cancel()
        assert lock is not None
        assert ticks >= 10
        await lock.arelease()  # (left held, it would be renewed for the rest of the run)

    asyncio.run(main())


def test_an_abort_signal_stops_an_async_wait(service: Locks) -> None:
    async def main() -> None:
        await service.aacquire("k")
        stop = AbortSignal()
        asyncio.get_running_loop().call_later(0.1, stop.abort)
        started = time.monotonic()
        assert await service.aacquire("k", wait="30s", signal=stop) is None
        assert time.monotonic() - started < 5
        assert await stop.wait_async(0) is True

    asyncio.run(main())


def test_an_acquire_cancelled_mid_call_releases_what_it_got() -> None:
    store = FaultyStore(InMemoryStore())
    store.hanging.add("acquire")
    service = Locks(store)

    async def main() -> None:
        task = asyncio.create_task(service.aacquire("k"))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        store.hanging.clear()
        store.unhang.set()  # the store call now completes and takes the key...
        await asyncio.sleep(0)

    asyncio.run(main())
    # ...and the cancelled acquire hands it back.
    eventually(lambda: "release" in store.calls, what="the cancelled acquire's lease is released")
    eventually(lambda: store.inner.leases() == [], what="the lease is gone")
