"""The public API on the in-memory store: exclusivity, tokens, waiting, context, errors."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from django.test import TestCase

from django_locks import AbortSignal, Lock, LockNotAcquiredError, Locks, current_lock, locks
from django_locks.exceptions import LockReleasedError, StoreError
from django_locks.stores import InMemoryStore
from tests.helpers import FaultyStore


@pytest.fixture
def service() -> Locks:
    return Locks(InMemoryStore(), ttl="30s")


def test_only_one_holder_at_a_time_and_tokens_grow(service: Locks) -> None:
    first = service.acquire("job")
    assert isinstance(first, Lock) and first.held
    assert service.acquire("job") is None
    first.release()
    second = service.acquire("job")
    assert second is not None
    assert second.fencing_token > first.fencing_token
    second.release()


def test_threads_racing_for_a_key_never_overlap(service: Locks) -> None:
    inside = 0
    overlaps = 0
    tokens: list[int] = []
    guard = threading.Lock()

    def worker() -> None:
        nonlocal inside, overlaps
        for _ in range(20):
            with service.lock("shared", wait="10s") as lock:
                with guard:
                    inside += 1
                    overlaps += inside > 1
                    tokens.append(lock.fencing_token)
                time.sleep(0.001)
                with guard:
                    inside -= 1

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlaps == 0
    assert len(tokens) == 160
    assert tokens == sorted(set(tokens))


def test_the_store_is_idempotent_for_the_lock_owner(service: Locks) -> None:
    lock = service.acquire("k")
    assert lock is not None
    again = service.store.acquire("k", lock.owner, 30_000)
    assert again == lock.fencing_token
    lock.release()


def test_wait_succeeds_when_the_holder_releases(service: Locks) -> None:
    holder = service.acquire("k")
    assert holder is not None
    threading.Timer(0.2, holder.release).start()
    started = time.monotonic()
    waiter = service.acquire("k", wait="5s")
    assert waiter is not None
    assert 0.15 < time.monotonic() - started < 4
    assert waiter.fencing_token > holder.fencing_token
    waiter.release()


def test_lock_raises_after_the_wait(service: Locks) -> None:
    holder = service.acquire("k")
    started = time.monotonic()
    with pytest.raises(LockNotAcquiredError) as caught, service.lock("k", wait=0.3):
        pytest.fail("the body must not run")
    assert time.monotonic() - started >= 0.3
    assert caught.value.key == "k" and caught.value.wait == 0.3
    assert holder is not None and holder.held


def test_an_abort_signal_stops_the_wait(service: Locks) -> None:
    holder = service.acquire("k")
    assert holder is not None
    stop = AbortSignal()
    threading.Timer(0.2, stop.abort).start()
    started = time.monotonic()
    assert service.acquire("k", wait="30s", signal=stop) is None
    assert time.monotonic() - started < 5
    # An already aborted signal means no try at all.
    before = len(service.store.leases())
    assert service.acquire("other", signal=stop) is None
    assert len(service.store.leases()) == before


def test_a_signal_first_asked_for_after_release_is_aborted_with_the_reason(
    service: Locks,
) -> None:
    # A lock's signal is made when first asked for: one made after the end is born aborted.
    lock = service.acquire("k")
    assert lock is not None
    assert lock.release() is True
    reason = lock.signal.reason
    assert isinstance(reason, LockReleasedError)
    assert (reason.key, reason.fencing_token) == ("k", lock.fencing_token)
    seen: list[object] = []
    lock.signal.add_callback(seen.append)  # runs at once: the signal is aborted already
    assert seen == [lock.signal]
    assert lock.signal.reason is reason  # one signal, made once


def test_the_signal_aborts_on_release_with_the_reason(service: Locks) -> None:
    lock = service.acquire("k")
    assert lock is not None
    seen: list[object] = []
    lock.signal.add_callback(lambda signal: seen.append(signal.reason))
    assert not lock.signal.aborted
    assert lock.release() is True
    assert lock.signal.aborted and not lock.held
    assert isinstance(lock.signal.reason, LockReleasedError)
    with pytest.raises(LockReleasedError):
        lock.signal.raise_if_aborted()
    assert lock.signal.wait(1)
    assert lock.release() is False  # already released: no store call, no error
    time.sleep(0.05)
    assert len(seen) == 1


def test_current_lock_inside_and_outside(service: Locks) -> None:
    assert current_lock() is None
    with service.lock("outer") as outer:
        assert current_lock() is outer
        with service.lock("inner") as inner:
            assert current_lock() is inner
        assert current_lock() is outer
        assert service.with_lock("fn", lambda: current_lock()).key == "fn"  # type: ignore[union-attr]
    assert current_lock() is None


def test_current_lock_follows_a_copied_context_into_a_thread(service: Locks) -> None:
    import contextvars

    seen: list[object] = []
    with service.lock("k") as lock:
        context = contextvars.copy_context()
        thread = threading.Thread(target=context.run, args=(lambda: seen.append(current_lock()),))
        thread.start()
        thread.join()
    assert seen == [lock]


def test_the_lock_is_released_when_the_block_raises(service: Locks) -> None:
    with pytest.raises(RuntimeError, match="boom"), service.lock("k") as lock:
        raise RuntimeError("boom")
    assert not lock.held
    assert service.acquire("k") is not None
    with pytest.raises(ZeroDivisionError):
        service.with_lock("fn", lambda: 1 / 0)
    assert service.acquire("fn") is not None


def test_with_lock_returns_the_result_and_raises_when_taken(service: Locks) -> None:
    assert service.with_lock("k", lambda: 42) == 42
    holder = service.acquire("k")
    with pytest.raises(LockNotAcquiredError):
        service.with_lock("k", lambda: 42)
    assert holder is not None


def test_store_errors_are_raised_never_turned_into_not_acquired() -> None:
    store = FaultyStore(InMemoryStore())
    store.failing.add("acquire")
    service = Locks(store)
    with pytest.raises(StoreError):
        service.acquire("k")
    with pytest.raises(StoreError), service.lock("k"):
        pass


def test_a_failing_release_keeps_the_block_exception_and_result(caplog) -> None:
    store = FaultyStore(InMemoryStore())
    service = Locks(store)
    with pytest.raises(KeyError), service.lock("k"):
        store.failing.add("release")
        raise KeyError("mine")
    store.failing.clear()

    # A block that succeeded keeps its result: the failed release is logged (SPEC section 10).
    def body() -> int:
        store.failing.add("release")
        return 42

    assert service.with_lock("j", body) == 42
    assert "Releasing lock 'j' failed" in caplog.text and "lapses within its ttl" in caplog.text
    lock = service.acquire("direct")
    assert lock is not None
    with pytest.raises(StoreError):
        lock.release()  # a direct call still raises


def test_release_inside_atomic_warns_with_the_fix(service: Locks, caplog, db) -> None:
    from django.db import transaction

    with transaction.atomic():
        lock = service.acquire("k")
        assert lock is not None
        lock.release()
    assert "Take the lock outside the transaction" in caplog.text


def test_only_a_release_inside_atomic_warns(service: Locks, caplog, transactional_db) -> None:
    from django.db import connection, transaction

    connection.close()  # this thread's connection is opened afresh, as in a new worker thread
    outside = service.acquire("outside")
    assert outside is not None
    with transaction.atomic():
        inside = service.acquire("inside")
        assert inside is not None
        inside.release()
    assert caplog.text.count("Take the lock outside the transaction") == 1
    outside.release()
    assert caplog.text.count("Take the lock outside the transaction") == 1


def test_the_default_service_uses_the_locks_setting() -> None:
    assert isinstance(locks.store, InMemoryStore)
    with locks.lock("default-service") as lock:
        assert lock.held


def test_a_connection_opened_before_the_import_still_warns(
    service: Locks, transactional_db: None
) -> None:
    """A thread whose connection was opened while nobody listened to `connection_created` (the
    project imported django_locks.lock only later) still gets the warning."""
    from django.db import connection, transaction
    from django.db.backends.signals import connection_created

    from django_locks.transactions import _remember_connection

    logged: list[str] = []

    def thread() -> None:
        connection_created.disconnect(dispatch_uid="django_locks")
        try:
            connection.ensure_connection()
        finally:
            connection_created.connect(
                _remember_connection, weak=False, dispatch_uid="django_locks"
            )
        with transaction.atomic():
            lock = service.acquire("opened-before")
            assert lock is not None
            handler = _ListHandler(logged)
            logger = logging.getLogger("django_locks")
            logger.addHandler(handler)
            try:
                lock.release()
            finally:
                logger.removeHandler(handler)
        connection.close()

    worker = threading.Thread(target=thread)
    worker.start()
    worker.join()
    assert any("Take the lock outside the transaction" in line for line in logged)


class _ListHandler(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class TestCaseWrappingTransaction(TestCase):
    """`TestCase` wraps every test in atomic blocks of its own: they are not the code's."""

    def test_its_own_transaction_does_not_warn(self) -> None:
        service = Locks(InMemoryStore())
        with self.assertNoLogs("django_locks", level="WARNING"):
            with service.lock("in-a-testcase"):
                pass

    def test_a_real_atomic_inside_it_still_warns(self) -> None:
        from django.db import transaction

        service = Locks(InMemoryStore())
        with self.assertLogs("django_locks", level="WARNING") as logs:
            with transaction.atomic(), service.lock("in-a-testcase"):
                pass
        assert "Take the lock outside the transaction" in logs.output[0]
