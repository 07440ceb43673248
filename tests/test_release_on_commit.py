"""``release="on_commit"`` on the in-memory store, following the ``default`` alias (SQLite):
released right after the commit, at once after a rollback or a savepoint's rollback, and despite
an earlier ``on_commit`` callback that raised; renewed until then; at once outside any
transaction; never with the inside-atomic() warning. A competitor in another thread asks the
store, as another process would (real servers, and a closed connection, in
test_release_on_commit_stores.py)."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction

from django_locks import Lock, Locks
from django_locks.stores import InMemoryStore
from tests.helpers import competitor_gets

pytestmark = pytest.mark.django_db(transaction=True)

WARNING = "Take the lock outside the transaction"


class Boom(Exception):
    pass


@pytest.fixture
def service() -> Locks:
    return Locks(InMemoryStore(), ttl="30s")


def test_released_right_after_the_commit_not_before(service: Locks, caplog: Any) -> None:
    with transaction.atomic():
        with service.lock("k", release="on_commit") as lock:
            pass
        assert lock.held
        assert not competitor_gets(service, "k")
        with transaction.atomic():  # a savepoint released (committed) keeps it pending
            pass
        assert not competitor_gets(service, "k")
    assert not lock.held and lock._keeper.state == "released"
    assert competitor_gets(service, "k")
    assert WARNING not in caplog.text


def test_after_the_commit_hooks_before_it_run_first(service: Locks) -> None:
    seen: list[bool] = []
    with transaction.atomic():
        with service.lock("k", release="on_commit") as lock:
            pass
        transaction.on_commit(lambda: seen.append(lock.held))
    # Ours was registered first, and runs first: the later callback sees it released.
    assert seen == [False]


def test_released_at_once_after_an_outer_rollback(service: Locks, caplog: Any) -> None:
    with pytest.raises(Boom), transaction.atomic():
        with service.lock("k", release="on_commit") as lock:
            pass
        raise Boom
    assert lock._keeper.state == "released"
    assert competitor_gets(service, "k")
    assert WARNING not in caplog.text


def test_a_block_that_raises_is_released_at_the_rollback(service: Locks) -> None:
    with pytest.raises(Boom), transaction.atomic():
        with service.lock("k", release="on_commit") as lock:
            raise Boom
    assert lock._keeper.state == "released"


def test_released_at_once_after_a_savepoint_rollback(service: Locks, caplog: Any) -> None:
    with transaction.atomic():
        with pytest.raises(Boom), transaction.atomic():
            with service.lock("k", release="on_commit") as lock:
                pass
            raise Boom
        # Still inside the outer transaction: the savepoint's writes are gone already.
        assert lock._keeper.state == "released"
        assert competitor_gets(service, "k")
        with service.lock("kept", release="on_commit") as kept:
            pass
    assert kept._keeper.state == "released"
    assert WARNING not in caplog.text


def failing_commit_hook() -> None:
    raise Boom


def test_released_despite_an_earlier_failing_on_commit_callback(service: Locks) -> None:
    with pytest.raises(Boom), transaction.atomic():
        transaction.on_commit(failing_commit_hook)  # robust=False: its error stops the rest
        with service.lock("k", release="on_commit") as lock:
            pass
    assert lock._keeper.state == "released"
    assert competitor_gets(service, "k")


def test_a_dropped_callback_kept_alive_by_a_traceback_is_released_by_the_timer() -> None:
    service = Locks(InMemoryStore(), ttl="3s")
    kept: list[BaseException] = []
    gc.disable()  # nothing but the timer may free the callback the traceback holds
    try:
        try:
            with transaction.atomic():
                transaction.on_commit(failing_commit_hook)
                with service.lock("k", release="on_commit") as lock:
                    pass
        except Boom as error:
            kept.append(error)  # its traceback holds Django's list of the callbacks left
        assert lock._keeper.state == "held"
        assert poll(lambda: lock._keeper.state == "released", 2.5)  # before its ttl of 3 s
        assert competitor_gets(service, "k")
    finally:
        gc.enable()
        kept.clear()


def test_renewed_while_the_transaction_stays_open_past_the_ttl() -> None:
    service = Locks(InMemoryStore(), ttl="600ms")
    with transaction.atomic():
        with service.lock("k", release="on_commit") as lock:
            pass
        time.sleep(1.5)  # two and a half ttls
        assert lock.held
        assert not competitor_gets(service, "k")
    assert competitor_gets(service, "k")


def test_outside_any_transaction_it_is_released_at_once(service: Locks, caplog: Any) -> None:
    with service.lock("k", release="on_commit") as lock:
        assert lock.held
    assert lock._keeper.state == "released"
    assert service.with_lock("k", lambda: 7, release="on_commit") == 7
    assert competitor_gets(service, "k")
    assert WARNING not in caplog.text


def test_with_lock_releases_on_commit(service: Locks) -> None:
    with transaction.atomic():
        held = service.with_lock("k", lambda: current(), release="on_commit")
        assert held.held and not competitor_gets(service, "k")
    assert not held.held and competitor_gets(service, "k")


def test_a_lock_lost_before_the_commit_is_announced_and_the_commit_does_nothing() -> None:
    store = InMemoryStore()
    service = Locks(store, ttl="30s")
    with transaction.atomic():
        with service.lock("k", release="on_commit") as lock:
            pass
        store.clear()  # its lease is gone: the next renewal says so
        lock._keeper._renew(lock._keeper.clock.monotonic())
        assert lock.signal.aborted
    assert lock._keeper.state == "lost"


def test_on_exit_inside_atomic_still_warns_naming_on_commit(service: Locks, caplog: Any) -> None:
    with transaction.atomic(), service.lock("k"):
        pass
    assert WARNING in caplog.text and 'release="on_commit"' in caplog.text


def current() -> Lock:
    from django_locks import current_lock

    lock = current_lock()
    assert lock is not None
    return lock


def poll(check: Callable[[], bool], seconds: float) -> bool:
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        if check():
            return True
        time.sleep(0.02)
    return check()
