"""Preempt requests on a real PostgreSQL (migration 0006): a request racing renewals, acquirers
and permits' churn, the functions' plan and session rules (PgBouncer's transaction mode), and the
functions of migrations 0002 to 0005, which the previous releases' processes call, unchanged."""

from __future__ import annotations

import hashlib
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections

from django_locks.exceptions import StoreError
from django_locks.holders import Holder
from django_locks.stores.base import PREEMPTED, PermitGrant, Renewed, Slot
from django_locks.stores.database import DatabaseStore, postgresql_permits_sql, postgresql_sql
from django_locks.stores.database.operations import FUNCTIONS, PREEMPT_MIGRATION
from django_locks.testing.holder_cases import WORKER
from tests.stores.test_postgres import functions_away, query

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "postgres"]),
]

TTL = 1500
"""The ttl of the leases the races preempt (ms): they lapse within the test."""


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
    return f"pgq:{uuid.uuid4().hex[:10]}"


def grant(store: DatabaseStore, name: str, owner: str, permits: int, ttl: int = 60_000) -> Slot:
    taken = store.acquire_permit(name, owner, ttl, permits, WORKER)
    assert isinstance(taken, PermitGrant), taken
    return Slot(name, taken.permit)


class Calls:
    """What the racing threads did: ``(what, who, start, end, result)``, on the monotonic clock;
    the first failure of any thread stops them all."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str, float, float, Any]] = []
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self._lock = threading.Lock()

    def record(self, what: str, who: str, call: Callable[[], Any]) -> Any:
        start = time.monotonic()
        result = call()
        with self._lock:
            self.log.append((what, who, start, time.monotonic(), result))
        return result

    def run(self, bodies: list[Callable[[], None]], seconds: float) -> None:
        def guarded(body: Callable[[], None]) -> None:
            try:
                while not self.stop.is_set():
                    body()
            except BaseException as exc:
                self.errors.append(exc)
                self.stop.set()

        threads = [threading.Thread(target=guarded, args=(body,)) for body in bodies]
        for thread in threads:
            thread.start()
        self.stop.wait(seconds)
        self.stop.set()
        for thread in threads:
            thread.join(30)
        assert not self.errors, self.errors

    def of(self, what: str) -> list[tuple[str, float, float, Any]]:
        return sorted((who, s, e, r) for w, who, s, e, r in self.log if w == what)


def second_of(store: DatabaseStore, batch: list[tuple[str, str, int]]) -> Renewed:
    """The answer for the second lease of a two-lease ``renew_many`` whose first is renewed."""
    answers = store.renew_many(batch)
    assert answers[0] is True, answers
    return answers[1]


@pytest.mark.slow
def test_a_request_racing_renewals_and_acquirers_stops_the_renewals_and_the_lease_lapses(
    store: DatabaseStore,
) -> None:
    """The holder's renewals (one at a time and in batches, on 4 connections) race 3 preempters
    and 3 acquirers: no renewal that began after a preempt answered renews; the lease is not
    extended (it lapses within its ttl of the last renewal that renewed, and one acquirer takes
    it); the other leases of the batches renew throughout."""
    name, holder = key(), "holder"
    token = store.acquire(name, holder, TTL)
    assert token is not None
    calls = Calls()

    def renewer(n: int) -> Callable[[], None]:
        other, owner = key(), f"other-{n}"
        assert store.acquire(other, owner, 60_000) is not None

        def body() -> None:
            if n % 2:
                calls.record("renew", str(n), lambda: store.renew(name, holder, TTL))
            else:
                # The call itself is timed (as `renew` above): an answer recorded after the
                # call returned would look later than it was (CI saw that under load).
                batch = [(other, owner, 60_000), (name, holder, TTL)]
                calls.record("renew", str(n), lambda: second_of(store, batch))
            time.sleep(0.005)

        return body

    def preempter(n: int) -> Callable[[], None]:
        def body() -> None:
            time.sleep(0.3 + 0.05 * n if not calls.of("preempt") else 0.01)
            calls.record("preempt", str(n), lambda: store.preempt(name))

        return body

    def acquirer(n: int) -> Callable[[], None]:
        def body() -> None:
            owner = f"acquirer-{n}-{uuid.uuid4().hex[:6]}"
            calls.record("acquire", owner, lambda: store.acquire(name, owner, 60_000))
            time.sleep(0.002)

        return body

    bodies = [renewer(n) for n in range(4)] + [preempter(n) for n in range(3)]
    calls.run([*bodies, *(acquirer(n) for n in range(3))], 0.3 + TTL / 1000 + 1.5)

    preempts, renewals = calls.of("preempt"), calls.of("renew")
    won = [(start, end, taken) for _, start, end, taken in calls.of("acquire") if taken]
    assert len(won) == 1, won  # the winner holds it for a minute
    (won_start, won_end, newer), first_asked = won[0], min(e for *_, e, r in preempts if r == token)
    assert newer > token
    renewed = [(start, end) for _, start, end, answer in renewals if answer is True]
    assert renewed and all(start < first_asked for start, _ in renewed), "renewed once asked"
    asked = [answer for _, start, _, answer in renewals if start > first_asked]
    assert PREEMPTED in asked and set(asked) <= {PREEMPTED, False}, set(asked)
    last_start, last_end = max(renewed, key=lambda times: times[1])
    # Lapsed at its last renewal's ttl: not before it, and not extended by the answers since.
    lapsed = last_start + TTL / 1000
    assert lapsed - 0.05 <= won_end and won_start <= last_end + TTL / 1000 + 0.5
    for _, start, end, named in preempts:
        if end < lapsed - 0.05:
            assert named == token, (named, token)
        elif start > won_end:
            assert named == newer, (named, newer)
        else:  # the lease lapsed, or the winner took it, meanwhile
            assert named in (token, None, newer), named
    print(f"{len(renewals)} renewals, {len(asked)} asked, {len(preempts)} preempts")


@pytest.mark.slow
def test_a_request_under_permits_asks_the_oldest_slot_while_slots_churn(
    store: DatabaseStore,
) -> None:
    """4 holders renew their slots in batches with a plain lease each; a holder answered
    preempted releases its slot and takes a new one (the newest), as the service's keeper and
    the replaced run do; 2 churners take and end slots; 2 preempters ask now and then. Every
    request names a slot live during the call, with a token no higher than any slot's live all
    through it (the oldest); only a named lease answers preempted, and never renews once named;
    the plain leases renew throughout. No call fails: preempt locks the key's own row first, as
    the others do (a deadlock would fail the call PostgreSQL picks)."""
    name, permits = key(), 6
    calls = Calls()
    lived: dict[int, list[float]] = {}  # token: acquire's start and end, release's start, end
    lived_lock = threading.Lock()
    forever = float("inf")

    def take(owner: str) -> tuple[Slot, int] | None:
        start = time.monotonic()
        taken = store.acquire_permit(name, owner, TTL, permits, WORKER)
        if not isinstance(taken, PermitGrant):
            assert isinstance(taken, Holder), taken
            return None
        with lived_lock:
            lived[taken.fencing_token] = [start, time.monotonic(), forever, forever]
        return Slot(name, taken.permit), taken.fencing_token

    def free(slot: Slot, owner: str, token: int) -> None:
        start = time.monotonic()
        assert store.end(slot, owner, "released")
        with lived_lock:
            lived[token][2:] = [start, time.monotonic()]

    def holder(n: int) -> Callable[[], None]:
        plain, plain_owner = key(), f"holder-{n}"
        assert store.acquire(plain, plain_owner, 60_000) is not None
        held: list[Any] = []  # the slot, its owner, its token

        def body() -> None:
            if not held:
                owner = f"holder-{n}-{uuid.uuid4().hex[:6]}"
                taken = take(owner)
                if taken is None:
                    return
                held[:] = [taken[0], owner, taken[1]]
            slot, owner, token = held
            batch = [(plain, plain_owner, 60_000), (slot, owner, TTL)]
            # The call itself is timed: a renewal answered before a request, recorded after
            # it, would look like one that ignored it (CI saw that under load).
            answer = calls.record("renew", str(token), lambda: second_of(store, batch))
            if answer is not True:
                assert answer == PREEMPTED, answer
                free(slot, owner, token)
                held.clear()
            time.sleep(0.01)

        return body

    def churner(n: int) -> Callable[[], None]:
        def body() -> None:
            owner = f"churner-{n}-{uuid.uuid4().hex[:6]}"
            taken = take(owner)
            if taken is not None:
                free(taken[0], owner, taken[1])
            time.sleep(0.003)

        return body

    def preempter(n: int) -> Callable[[], None]:
        def body() -> None:
            time.sleep(0.2 + random.random() * 0.2)
            calls.record("preempt", str(n), lambda: store.preempt(name))

        return body

    bodies = [holder(n) for n in range(4)] + [churner(n) for n in range(2)]
    calls.run([*bodies, *(preempter(n) for n in range(2))], 4.0)

    named: dict[int, tuple[float, float]] = {}  # token: the first request naming it
    for _, start, end, token in sorted(calls.of("preempt"), key=lambda call: call[1]):
        assert token in lived, token
        taken_from, _, _, freed_at = lived[token]
        assert taken_from < end and freed_at > start, "named a slot not live during the call"
        for other, (_, taken_at, freed_from, _) in lived.items():
            if taken_at < start and freed_from > end:  # an older slot, live all through
                assert token <= other, (token, other)
        named.setdefault(token, (start, end))
    answers = calls.of("renew")
    for token, start, end, answer in answers:
        asked = named.get(int(token))
        if answer == PREEMPTED:
            assert asked is not None and asked[0] < end, (token, asked)
        elif asked is not None and start > asked[1]:
            raise AssertionError(f"slot {token} renewed after a request named it")
    rotations = sum(answer == PREEMPTED for *_, answer in answers)
    assert rotations >= 3 and sum(answer is True for *_, answer in answers) > 50, rotations
    print(f"{len(answers)} renewals, {rotations} slots given up, {len(lived)} slots taken")


def token_of(store: DatabaseStore, name: str) -> int:
    info = store.lease(name)
    assert info is not None, name
    return info.fencing_token


def test_0006_functions_keep_their_plan_settings_to_themselves(store, sql) -> None:
    """As 0005's: the functions reading a key's slots run on generic plans (their own setting,
    restored when they return), the others as PostgreSQL chooses. After every operation, many
    times over (past the 5 custom plans a cached plan starts with), the store's connection has
    no session state and no prepared statement: all of it works behind PgBouncer in transaction
    mode. The answers stay right on the generic plans, whatever the permits value."""
    cursor = sql.cursor()
    cursor.execute("SELECT proname, proconfig FROM pg_proc WHERE proname LIKE 'django_locks_%%'")
    settings = dict(cursor.fetchall())
    generic = ["plan_cache_mode=force_generic_plan"]
    assert settings["django_locks_preempt"] == generic
    assert settings["django_locks_acquire_slot"] == settings["django_locks_acquire_permit"]
    assert settings["django_locks_acquire_lease"] == settings["django_locks_acquire_plain"]
    assert settings["django_locks_renew_permits"] == settings["django_locks_renew_slots"]
    assert settings["django_locks_renew"] is None
    for permits in (2, 7, 1000):
        name, plain = key(), key()
        for n in range(8):
            slot = grant(store, name, f"p{n}", permits) if n < permits else None
            assert store.preempt(name) == token_of(store, f"{name}#1")  # the oldest
            assert store.acquire(plain, "plain", 60_000) is not None
            assert store.preempt(plain) is not None
            assert store.renew(plain, "plain", 60_000) == PREEMPTED
            assert store.renew_many([(plain, "plain", 60_000)]) == [PREEMPTED]
            if slot is not None and slot.permit > 1:
                assert store.renew(slot, f"p{n}", 60_000) is True
                assert store.renew_many([(slot, f"p{n}", 60_000)]) == [True]
        assert store.renew(Slot(name, 1), "p0", 60_000) == PREEMPTED

    def session(cursor: Any) -> tuple[Any, ...]:
        cursor.execute(
            "SELECT current_setting('plan_cache_mode'), "
            "(SELECT count(*) FROM pg_prepared_statements)"
        )
        return tuple(cursor.fetchone())

    pools = store._pools
    assert pools.run(session, (), None, renewal=True, write=False) == ("auto", 0)


# The texts migrations 0002, 0003 and 0005 created their functions from, as they shipped: a
# fresh database migrates them from the modules of today, so a change to a shared piece of SQL
# (``_LIVE``, ``_acquire_plain()``, ...) would change what a previous release's process calls.
SHIPPED = {
    (postgresql_sql, "PG_FUNCTIONS"): "8599ab4e80fd774bbc9e81dc639c92b8",
    (postgresql_sql, "PG_DROP_FUNCTIONS"): "ebbd2169d5765a80603d27db8780300f",
    (postgresql_sql, "PG_FUNCTIONS_V3"): "bc70b0ec5533d419146fe6a2b855e200",
    (postgresql_sql, "PG_DROP_FUNCTIONS_V3"): "31618f5f391cd453821a0ac14fc097f8",
    (postgresql_permits_sql, "PG_FUNCTIONS_V5"): "64e4a0934558640220646cb897d30c16",
    (postgresql_permits_sql, "PG_DROP_FUNCTIONS_V5"): "b903f636b27dc8909e8e6a38e0726ef0",
}


def test_the_functions_of_migrations_0002_to_0005_are_the_texts_they_shipped() -> None:
    for (module, name), digest in SHIPPED.items():
        text = getattr(module, name)
        assert hashlib.sha256(text.encode()).hexdigest()[:32] == digest, name


def test_the_previous_functions_still_work_after_0006_and_ignore_requests(store, sql) -> None:
    """What a process calling 0002's, 0003's or 0005's functions does on a migrated database:
    it renews a preempted lease (it knows no requests), takes and ends leases as before; its
    new lease leaves the request behind, naming the ended lease's token: ignored."""
    name = key()
    token = store.acquire(name, "one", 60_000)
    assert token is not None and store.preempt(name) == token
    renew_slots = (
        "SELECT * FROM django_locks_renew_slots(ARRAY[%s], ARRAY['one'], ARRAY[60000::bigint], "
        "ARRAY[NULL::text], NULL)"
    )
    assert query(sql, renew_slots, name) == (name, "one")  # renewed: a 0005 process
    assert store.renew(name, "one", 60_000) == PREEMPTED  # still asked
    assert query(sql, "SELECT django_locks_acquire(%s, 'old', 'old:1', 60000)", name) == (None,)
    assert query(sql, "SELECT django_locks_end(%s, 'one', 'released')", name) == (True,)
    newer = query(sql, "SELECT django_locks_acquire(%s, 'old', 'old:1', 60000)", name)[0]
    assert newer > token
    assert query(sql, "SELECT preempt_token FROM django_locks_lease WHERE key = %s", name) == (
        token,
    )  # left behind by 0002's acquire: stale
    assert store.renew(name, "old", 60_000) is True
    assert store.preempt(name) == newer and store.renew(name, "old", 60_000) == PREEMPTED
    assert query(sql, "SELECT django_locks_release(%s, 'old')", name) == (True,)
    # 0003's and 0005's acquires take it; this release's acquire of a new lease clears it.
    plain = query(
        sql, "SELECT taken FROM django_locks_acquire_plain(%s, 'p', 'p:1', NULL, NULL, 60000)", name
    )[0]
    assert plain > newer and store.renew(name, "p", 60_000) is True
    assert query(sql, "SELECT django_locks_end(%s, 'p', 'released')", name) == (True,)
    assert store.acquire(name, "two", 60_000) is not None
    assert query(sql, "SELECT preempt_token FROM django_locks_lease WHERE key = %s", name) == (
        None,
    )
    # Permits: 0005's permit functions beside a preempted slot.
    permits = key()
    oldest = grant(store, permits, "s1", 3)
    asked = store.preempt(permits)
    assert asked == token_of(store, oldest)
    call = "SELECT taken, permit FROM django_locks_acquire_permit(%s, %s, 'x:1', NULL, NULL, "
    taken = query(sql, call + "60000, 3)", permits, "s2")
    assert taken[0] > asked and taken[1] == 2
    assert store.renew(oldest, "s1", 60_000) == PREEMPTED
    assert store.renew(Slot(permits, 2), "s2", 60_000) is True
    end_slot = "SELECT django_locks_end_slot(%s, %s, 's1', 'released', NULL)"
    assert query(sql, end_slot, permits, str(oldest)) == (True,)
    assert store.preempt(permits) == taken[0]


def test_without_migration_0006_the_store_works_as_before_and_refuses_preempt(
    store, sql, caplog
) -> None:
    """A process of this release on a database without 0006's functions (the migration not run
    yet, a restored dump): one warning, acquires and renewals as before (no request answered),
    preempt() refused naming migrate, a W102 whose hint brings the functions back; the same
    store finds them again with its next preempt()."""
    with functions_away(sql, *FUNCTIONS[PREEMPT_MIGRATION]):
        name, permits = key(), key()
        token = store.acquire(name, "one", 60_000)
        assert token is not None
        assert caplog.text.count(PREEMPT_MIGRATION) == 1, caplog.text
        assert store.renew(name, "one", 60_000) is True
        assert store.renew_many([(name, "one", 60_000)]) == [True]
        slot = grant(store, permits, "s1", 3)
        assert store.renew_many([(slot, "s1", 60_000)]) == [True]
        with pytest.raises(StoreError, match="migrate django_locks --database postgres"):
            store.preempt(name)
        (message,) = store.check(databases=["postgres"])
        assert message.id == "django_locks.W102"
        for signature in FUNCTIONS[PREEMPT_MIGRATION]:
            assert signature.partition("(")[0] in message.msg
        commands = re.findall(r"`manage.py ([^`]*)`", message.hint)
        assert commands == [
            "migrate django_locks 0005 --database postgres",
            "migrate django_locks --database postgres",
        ], message.hint
        for command in commands:
            call_command(*command.split(), verbosity=0)
        assert store.check(databases=["postgres"]) == []
        assert store.preempt(name) == token
        assert store.renew(name, "one", 60_000) == PREEMPTED
        assert store.preempt(permits) == token_of(store, slot)
        assert store.renew_many([(slot, "s1", 60_000)]) == [PREEMPTED]


def test_a_table_without_the_0006_column_renews_as_before_and_says_how_to_add_it(
    store, sql
) -> None:
    name = key()
    assert store.acquire(name, "one", 60_000) is not None
    query(sql, "ALTER TABLE django_locks_lease RENAME COLUMN preempt_token TO away_token")
    try:
        assert store.renew(name, "one", 60_000) is True  # 0006's call failed: 0003's statement
        assert store.acquire(key(), "two", 60_000) is not None
        with pytest.raises(StoreError, match="0006_preempt"):
            store.preempt(name)
        (message,) = store.check(databases=["postgres"])
    finally:
        query(sql, "ALTER TABLE django_locks_lease RENAME COLUMN away_token TO preempt_token")
    assert message.id == "django_locks.W102"
    assert "column preempt_token of django_locks_lease is missing" in message.msg
    assert "migrate django_locks 0005 --fake --database postgres" in message.hint
    assert store.preempt(name) is not None and store.renew(name, "one", 60_000) == PREEMPTED
