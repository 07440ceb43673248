"""Permits on a real PostgreSQL: the lock order of migration 0005's functions (no deadlock with
slots of the same keys renewed in batches while others take, end and force-release them), what
a previous release's functions find, and the store without those functions."""

from __future__ import annotations

import datetime
import random
import re
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections

from django_locks.exceptions import PermitsMismatchError, StoreError
from django_locks.holders import Holder
from django_locks.stores.base import PERMITS_OWNER, LeaseInfo, PermitGrant, Slot
from django_locks.stores.database import DatabaseStore
from django_locks.stores.database.operations import (
    FUNCTIONS,
    PERMITS_MIGRATION,
    PREEMPT_MIGRATION,
)
from django_locks.testing.holder_cases import WORKER
from tests.stores.test_postgres import functions_away, query

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "postgres"]),
]


@pytest.fixture
def store() -> Iterator[DatabaseStore]:
    store = DatabaseStore("postgres")
    yield store
    store.close()


@pytest.fixture
def sql(postgres_server: Any) -> Iterator[Any]:
    """A plain connection of the test's own to the test database (autocommit)."""
    conn = postgres_server.connect(connections["postgres"].settings_dict["NAME"])
    yield conn
    conn.close()


def key() -> str:
    return f"pgp:{uuid.uuid4().hex[:10]}"


def expiry(info: LeaseInfo) -> datetime.datetime:
    expires_at = info.described.expires_at
    assert expires_at is not None
    return expires_at


def grant(store: DatabaseStore, name: str, owner: str, permits: int) -> PermitGrant:
    taken = store.acquire_permit(name, owner, 60_000, permits, WORKER)
    assert isinstance(taken, PermitGrant), taken
    return taken


@pytest.mark.slow
def test_slots_of_the_same_keys_renewed_in_batches_while_others_take_and_end_them() -> None:
    """Renewers each holding a slot of the same 3 keys renew them in one batch (in another order
    each time) while churners take and end slots and an operator force-releases the keys now
    and then: every base row is locked before its slots, a batch's bases in key order, so no
    call fails (a deadlock is an error of the call that PostgreSQL picks), and no key ever has
    more live slots than its permits or an expiry before one of its slots'."""
    names, permits, seconds = [key() for _ in range(3)], 6, 4.0
    stop = threading.Event()
    errors: list[BaseException] = []
    counts = {"renewed": 0, "batches": 0, "taken": 0, "ended": 0, "forced": 0, "checks": 0}
    count_lock = threading.Lock()

    def counted(what: str, n: int = 1) -> None:
        with count_lock:
            counts[what] += n

    def guarded(body: Any) -> Any:
        def run() -> None:
            store = DatabaseStore("postgres")
            try:
                while not stop.is_set():
                    body(store)
            except BaseException as exc:
                errors.append(exc)
                stop.set()
            finally:
                store.close()

        return run

    def renewer(worker: int) -> Any:
        owner = f"renewer-{worker}-{uuid.uuid4().hex[:6]}"
        plain = key()
        held: dict[str, Slot] = {}

        def body(store: DatabaseStore) -> None:
            for name in names:
                if name not in held:
                    taken = store.acquire_permit(name, owner, 5_000, permits, WORKER)
                    if isinstance(taken, PermitGrant):
                        held[name] = Slot(name, taken.permit)
            assert store.acquire(plain, owner, 5_000) is not None
            batch: list[tuple[str, str, int]] = [(slot, owner, 5_000) for slot in held.values()]
            batch.append((plain, owner, 5_000))
            random.shuffle(batch)
            answers = store.renew_many(batch)
            counted("batches")
            counted("renewed", sum(answer is True for answer in answers))
            for (lease, _, _), renewed in zip(batch, answers, strict=True):
                if isinstance(lease, Slot) and renewed is not True:
                    del held[lease.base]  # force-released: taken again next time

        return body

    def churner(worker: int) -> Any:
        def body(store: DatabaseStore) -> None:
            owner = f"churner-{worker}-{uuid.uuid4().hex[:6]}"
            name = random.choice(names)
            taken = store.acquire_permit(name, owner, 5_000, permits, WORKER)
            if isinstance(taken, PermitGrant):
                counted("taken")
                slot = Slot(name, taken.permit)
                assert store.renew(slot, owner, 5_000) in (True, False)
                if store.end(slot, owner, "released"):
                    counted("ended")

        return body

    def operator(store: DatabaseStore) -> None:
        time.sleep(0.3)
        name = random.choice(names)
        if store.force_end(name if random.random() < 0.5 else f"{name}#1", "test"):
            counted("forced")

    def checker(store: DatabaseStore) -> None:
        for name in names:
            infos = [info for info in store.leases() if info.key.startswith(name)]
            slots = [info for info in infos if info.permit is not None]
            assert len(slots) <= permits, slots
            summary = [info for info in infos if info.key == name]
            if slots:
                assert summary and summary[0].owner == PERMITS_OWNER, infos
                # The exact expiries: expires_in is rounded to the millisecond row by row.
                latest = max(expiry(info) for info in slots)
                assert expiry(summary[0]) >= latest, (summary, slots)
        counted("checks")
        time.sleep(0.05)

    bodies = [renewer(n) for n in range(4)] + [churner(n) for n in range(3)]
    threads = [threading.Thread(target=guarded(body)) for body in [*bodies, operator, checker]]
    for thread in threads:
        thread.start()
    stop.wait(seconds)
    stop.set()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    assert counts["batches"] > 50 and counts["taken"] > 50 and counts["checks"] > 10, counts


def test_a_previous_release_finds_a_key_held_by_permits_held(store, sql) -> None:
    """0002's and 0003's acquires (a 0.1.0 or 0.2.0 process) find the key held by permits held,
    the latter naming the holder of the latest slot taken; its slots are never theirs."""
    name = key()
    grant(store, name, "one", 3)
    row = query(sql, "SELECT django_locks_acquire(%s, 'old', 'old:1', 60000)", name)
    assert row == (None,)
    taken, held_by, *_ = query(
        sql, "SELECT * FROM django_locks_acquire_as(%s, 'old', 'old:1', NULL, NULL, 60000)", name
    )
    assert taken is None and held_by == WORKER.address
    info = store.lease(name)
    assert info is not None and info.owner == PERMITS_OWNER and info.permits == 3
    assert info.is_summary


def test_a_slot_key_a_previous_release_took_plain_is_skipped(store, sql) -> None:
    """A 0.2.0 process's plain lock on "k#1" while the key is free: the permit takes slot 2."""
    name = key()
    query(
        sql,
        "SELECT * FROM django_locks_acquire_as(%s, 'old', 'old:1', NULL, NULL, 60000)",
        f"{name}#1",
    )
    assert grant(store, name, "new", 3).permit == 2
    assert grant(store, name, "newer", 3).permit == 3
    full = store.acquire_permit(name, "late", 60_000, 3, WORKER)
    assert isinstance(full, Holder)


def test_a_slot_s_key_is_refused_to_a_plain_lock_while_live_and_plain_once_ended(store) -> None:
    name = key()
    token, permit = grant(store, name, "one", 4)
    slot = Slot(name, permit)
    with pytest.raises(PermitsMismatchError) as raised:
        store.acquire(str(slot), "one", 60_000)  # its own holder too
    assert (raised.value.permits, raised.value.live) == (1, 4)
    with pytest.raises(PermitsMismatchError) as raised:
        store.acquire_permit(str(slot), "two", 60_000, 4, WORKER)
    assert (raised.value.permits, raised.value.live) == (4, 1)
    assert store.end(slot, "one", "released")
    # Ended: the row is a plain lease's now (no longer a slot's, nor listed as one).
    plain = store.acquire(str(slot), "plain", 60_000)
    assert plain is not None and plain > token
    info = store.lease(str(slot))
    assert info is not None and (info.permit, info.permits) == (None, None)
    # The key itself is free again: a plain lock takes it, above every slot's token; its
    # record no longer reads as a summary.
    again = store.acquire(name, "plain", 60_000)
    assert again is not None and again > plain
    info = store.lease(name)
    assert info is not None and info.permits is None and not info.is_summary
    # A permit taken meanwhile of the key whose slot row is plain-held skips that slot.
    assert store.release(name, "plain")
    assert grant(store, name, "three", 4).permit == (1 if permit != 1 else 2)


def test_without_migration_0005_permits_are_refused_naming_migrate(store, sql, caplog) -> None:
    signatures = FUNCTIONS[PERMITS_MIGRATION]
    with functions_away(sql, *signatures, *FUNCTIONS[PREEMPT_MIGRATION]):  # 0006's need 0005
        name = key()
        # Plain locks keep working, through 0003's function (it answers the holder).
        assert store.acquire_as(name, "one", 60_000, WORKER) is not None
        assert PERMITS_MIGRATION in caplog.text  # said once, by the first plain acquire
        assert isinstance(store.acquire_as(name, "two", 60_000, WORKER), Holder)
        assert store.force_release(name) and not store.release(name, "one")
        with pytest.raises(StoreError, match="migrate django_locks --database postgres"):
            store.acquire_permit(name, "one", 60_000, 3, WORKER)
        (message,) = store.check(databases=["postgres"])
        assert message.id == "django_locks.W102"
        for signature in signatures:
            assert signature.partition("(")[0] in message.msg
        commands = re.findall(r"`manage.py ([^`]*)`", message.hint)
        assert commands == [
            "migrate django_locks 0004 --database postgres",
            "migrate django_locks --database postgres",
        ], message.hint
        for command in commands:
            call_command(*command.split(), verbosity=0)
        assert store.check(databases=["postgres"]) == []
        # The same store finds the functions again with its next acquire_permit.
        grant(store, name, "one", 3)
        with pytest.raises(PermitsMismatchError):
            store.acquire(name, "plain", 60_000)


def test_a_prune_skips_the_ended_key_row_a_permit_s_acquire_has_locked(store, sql) -> None:
    """acquire_permit locks its key's own row first (a row lock, which prune's table lock lets
    through), then writes (which waits for that table lock): prune leaves a locked row alone
    instead of waiting for it, which would be a deadlock. The acquire's steps, one by one."""
    name, other = key(), key()
    for each in (name, other):
        assert store.acquire(each, "gone", 60_000) is not None and store.release(each, "gone")
    query(sql, "BEGIN")
    try:
        query(sql, "SELECT 1 FROM django_locks_lease WHERE key = %s FOR NO KEY UPDATE", name)
        pruned: list[int] = []
        pruner = threading.Thread(target=lambda: pruned.append(store.prune(0)))
        pruner.start()
        pruner.join(10)
        assert pruned and pruned[0] >= 1, "prune waited for the locked row"
        query(sql, "UPDATE django_locks_lease SET holder = 'x' WHERE key = %s", name)
    finally:
        query(sql, "COMMIT")
    assert store.lease(name, include_inactive=True) is not None, "the locked row was kept"
    assert store.lease(other, include_inactive=True) is None, "the other row was pruned"
