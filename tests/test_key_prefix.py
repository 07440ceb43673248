"""``LOCKS["KEY_PREFIX"]``: validated at startup; the service's lease queries (``leases()``,
``lease()``, ``force_release()``, ``clear()``, ``prune()``) act on its own keys alone and show
them without the prefix, with another project's leases under another prefix in the same store;
``reset_locks()`` frees only its own; the database store prunes one prefix's rows in SQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.test import override_settings
from hypothesis import given
from hypothesis import strategies as st

from django_locks import conf
from django_locks.holders import this_process
from django_locks.service import Locks, locks
from django_locks.stores.base import LockStore
from django_locks.stores.database import DatabaseStore
from django_locks.stores.database.operations import TABLE
from django_locks.stores.memory import InMemoryStore
from django_locks.testing import reset_locks

MEMORY = "django_locks.stores.InMemoryStore"
DATABASE = "django_locks.stores.DatabaseStore"
ON_POSTGRES = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "postgres"]),
]


# Validation.


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (5, "`LOCKS['KEY_PREFIX']` must be a str prepended to every key ('' for none), got int"),
        (None, "`LOCKS['KEY_PREFIX']` must be a str"),
        (b"a:", "`LOCKS['KEY_PREFIX']` must be a str"),
        ("a\x00:", "`LOCKS['KEY_PREFIX']` must not contain NUL characters"),
        ("a\ud800", "`LOCKS['KEY_PREFIX']` must not contain lone surrogates"),
        ("p" * 401, "`LOCKS['KEY_PREFIX']` must be at most 400 characters"),
    ],
)
def test_a_bad_key_prefix_refuses_to_start_naming_the_setting_and_the_rule(value, message):
    with pytest.raises(ImproperlyConfigured) as caught:
        conf.read({"BACKEND": MEMORY, "KEY_PREFIX": value})
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (True, "got True"),
        ("10ms", "at least 50ms"),
        ("367d", "at most 366 days"),
        (float("nan"), "got nan"),
        (float("inf"), "got inf"),
        (-1, "got -1"),
        ("soon", "got 'soon'"),
        ([1], "got [1]"),
    ],
)
def test_a_bad_max_hold_refuses_to_start_naming_the_setting_and_the_rule(value, message):
    with pytest.raises(ImproperlyConfigured) as caught:
        conf.read({"BACKEND": MEMORY, "MAX_HOLD": value})
    assert "`LOCKS['MAX_HOLD']` must be None or a positive duration" in str(caught.value)
    assert message in str(caught.value)


def test_both_settings_default_to_none_and_are_read_into_the_config():
    config = conf.read({"BACKEND": MEMORY})
    assert config.key_prefix == "" and config.max_hold_ms is None
    config = conf.read({"BACKEND": MEMORY, "KEY_PREFIX": "shop:", "MAX_HOLD": "2h"})
    assert config.key_prefix == "shop:" and config.max_hold_ms == 7_200_000
    assert conf.read({"BACKEND": MEMORY, "MAX_HOLD": 0.05}).max_hold_ms == 50
    assert conf.read({"BACKEND": MEMORY, "KEY_PREFIX": "p" * 400}).key_prefix == "p" * 400


@given(st.text(max_size=400).filter(lambda s: "\x00" not in s))
def test_any_prefix_of_at_most_400_characters_without_nul_is_taken_as_it_is(prefix):
    try:
        prefix.encode("utf-8")
    except UnicodeEncodeError:
        with pytest.raises(ImproperlyConfigured, match="LOCKS\\['KEY_PREFIX'\\].*surrogates"):
            conf.read({"BACKEND": MEMORY, "KEY_PREFIX": prefix})
        return
    assert conf.read({"BACKEND": MEMORY, "KEY_PREFIX": prefix}).key_prefix == prefix


@given(st.text(max_size=200), st.text(max_size=200))
def test_a_prefix_with_nul_anywhere_is_refused(head, tail):
    with pytest.raises(ImproperlyConfigured, match="LOCKS\\['KEY_PREFIX'\\].*NUL|surrogates"):
        conf.read({"BACKEND": MEMORY, "KEY_PREFIX": head + "\x00" + tail})


@given(st.integers() | st.floats() | st.binary() | st.lists(st.text()) | st.booleans())
def test_a_prefix_that_is_not_a_str_is_refused(value):
    with pytest.raises(ImproperlyConfigured, match="LOCKS\\['KEY_PREFIX'\\]` must be a str"):
        conf.read({"BACKEND": MEMORY, "KEY_PREFIX": value})


def test_a_bad_prefix_stops_the_app_at_ready():
    from django.apps import apps

    with override_settings(LOCKS={"BACKEND": MEMORY, "KEY_PREFIX": 7}):
        with pytest.raises(ImproperlyConfigured, match="KEY_PREFIX"):
            apps.get_app_config("django_locks").ready()
    with override_settings(LOCKS={"BACKEND": MEMORY, "MAX_HOLD": "1ms"}):
        with pytest.raises(ImproperlyConfigured, match="MAX_HOLD"):
            apps.get_app_config("django_locks").ready()


# Two projects on one store: "a:" (ours) and "b:" (theirs).


def take(store: LockStore, key: str, ttl_ms: int = 60_000) -> int:
    token = store.acquire_as(key, uuid.uuid4().hex, ttl_ms, this_process())
    assert isinstance(token, int), token
    return token


def shared_store_scenario(store: LockStore) -> None:
    ours, theirs = Locks(store, key_prefix="a:"), Locks(store, key_prefix="b:")
    take(store, "a:report")
    take(store, "a:export")
    take(store, "b:report")
    take(store, "b:other")
    take(store, "unprefixed")
    assert [info.key for info in ours.leases()] == ["export", "report"]
    assert [info.key for info in theirs.leases()] == ["other", "report"]
    unprefixed = Locks(store)
    assert {info.key for info in unprefixed.leases()} >= {"a:report", "b:report", "unprefixed"}
    info = ours.lease("report")
    assert info is not None and info.key == "report" and info.state == "held"
    assert ours.lease("other") is None  # theirs, not ours
    assert ours.lease("a:report") is None  # the prefix is not given twice
    assert theirs.force_release("report", by="admin bob")
    assert ours.lease("report") is not None, "their release left ours alone"
    ended = theirs.lease("report", include_inactive=True)
    if store.keeps_ended_leases and store.describes_holders:
        assert ended is not None and ended.key == "report" and ended.ended_by == "admin bob"
    assert not theirs.force_release("report")
    ours.clear()
    assert ours.leases() == []
    assert [info.key for info in theirs.leases()] == ["other"]
    assert unprefixed.lease("unprefixed") is not None
    # Every key keeps its token: the next one is greater.
    before = store.lease("a:export", include_inactive=True)
    again = take(store, "a:export")
    assert before is None or again > before.fencing_token


def test_the_lease_queries_keep_to_their_prefix_in_memory():
    shared_store_scenario(InMemoryStore())


@pytest.mark.django_db(transaction=True)
def test_the_lease_queries_keep_to_their_prefix_on_sqlite():
    store = DatabaseStore()
    try:
        store.clear()
        shared_store_scenario(store)
    finally:
        store.clear()
        store.close()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
def test_the_lease_queries_keep_to_their_prefix_on_postgres(postgres_server):
    store = DatabaseStore("postgres")
    try:
        store.clear()
        shared_store_scenario(store)
    finally:
        store.clear()
        store.close()


@pytest.mark.redis
def test_the_lease_queries_keep_to_their_prefix_on_redis(redis_server):
    from django_locks.stores.redis import RedisStore

    store = RedisStore(url=redis_server.url)
    try:
        store.clear()
        shared_store_scenario(store)
    finally:
        store.clear()
        store.close()


def test_slots_and_summaries_are_listed_without_the_prefix():
    store = InMemoryStore()
    ours = Locks(store, key_prefix="a:")
    for _ in range(2):
        store.acquire_permit("a:pool", uuid.uuid4().hex, 60_000, 3, this_process())
    store.acquire_permit("b:pool", uuid.uuid4().hex, 60_000, 3, this_process())
    listed = {info.key: info for info in ours.leases()}
    assert sorted(listed) == ["pool", "pool#1", "pool#2"]
    assert listed["pool"].is_summary and listed["pool#2"].permit == 2
    assert ours.force_release("pool#1", by="cli ops")
    assert sorted(info.key for info in ours.leases()) == ["pool", "pool#2"]
    ours.clear()
    assert ours.leases() == []
    assert len(Locks(store, key_prefix="b:").leases()) == 2  # its summary and its one slot


def test_a_key_too_long_with_the_prefix_is_refused_before_any_store_call():
    ours = Locks(InMemoryStore(), key_prefix="p" * 400)
    with pytest.raises(ValueError, match="with the key prefix"):
        ours.lease("k" * 101)
    with pytest.raises(ValueError, match="with the key prefix"):
        ours.force_release("k" * 101)
    assert ours.lease("k" * 100) is None
    with pytest.raises(TypeError, match="`by` must be a str"):
        ours.force_release("k", by=5)  # type: ignore[arg-type]


def test_a_store_that_cannot_prune_one_prefix_says_so():
    """A store that keeps ended leases but whose prune() takes no prefix: pruning one
    project's records alone is refused rather than deleting another project's."""

    class NoPrefix(InMemoryStore):
        def prune(self, older_than_ms: int, *, dry_run: bool = False) -> int:  # type: ignore[override]
            return super().prune(older_than_ms, dry_run=dry_run)

    ours = Locks(NoPrefix(), key_prefix="a:")
    with pytest.raises(NotImplementedError, match="key prefix"):
        ours.prune(0)
    with pytest.raises(TypeError, match="older_than_ms"):
        ours.prune("30d")  # type: ignore[arg-type]
    assert Locks(NoPrefix()).prune(0) == 0  # no prefix: the store's own prune


def test_the_in_memory_store_prunes_one_prefix():
    store = InMemoryStore()
    ours, theirs = Locks(store, key_prefix="a:"), Locks(store, key_prefix="b:")
    for service in (ours, theirs):
        lock = service.acquire("k")
        assert lock is not None
        lock.release()
    assert ours.prune(0, dry_run=True) == 1
    assert ours.prune(0) == 1
    assert [info.key for info in theirs.leases(include_inactive=True)] == ["k"]
    assert ours.leases(include_inactive=True) == []
    again = ours.acquire("k")
    assert again is not None and again.fencing_token > 1, "its token does not go back"
    again.release()


# The database store prunes one prefix's rows in SQL.


def ended(store: LockStore, alias: str, keys: list[str]) -> dict[str, int]:
    """Each key taken, released and backdated 40 days: its token."""
    tokens = {}
    for name in keys:
        owner = uuid.uuid4().hex
        tokens[name] = store.acquire(name, owner, 60_000)
        store.release(name, owner)
    with connections[alias].cursor() as cursor:
        for name in keys:
            if connections[alias].vendor == "postgresql":
                cursor.execute(
                    f"UPDATE {TABLE} SET expires_at = expires_at - interval '40 days', "
                    "released_at = released_at - interval '40 days' WHERE key = %s",
                    [name],
                )
            else:
                cursor.execute(
                    f"UPDATE {TABLE} SET "
                    "expires_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', expires_at, '-40 days'), "
                    "released_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', released_at, '-40 days') "
                    "WHERE key = %s",
                    [name],
                )
    return {name: int(token) for name, token in tokens.items() if token is not None}


def rows(alias: str) -> set[str]:
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT key FROM {TABLE}")
        return {row[0] for row in cursor.fetchall()}


def prune_scenario(store: DatabaseStore, alias: str) -> None:
    # Exactly the prefix: not its case, not what LIKE's wildcards would match.
    ours = ["a_%:old", "a_%:older"]
    others = ["A_%:old", "ab%:old", "a_x:old", "b:old", "old"]
    tokens = ended(store, alias, ours + others)
    take(store, "a_%:held")
    service = Locks(store, key_prefix="a_%:")
    assert service.prune(30 * 86_400_000, dry_run=True) == 2
    assert set(ours + others) <= rows(alias)
    assert service.prune(60 * 86_400_000) == 0
    assert service.prune(30 * 86_400_000) == 2
    assert rows(alias) & set(ours + others) == set(others)
    assert "a_%:held" in rows(alias)
    for name in ours:  # the pruned keys' tokens still go up
        assert take(store, name) > tokens[name]
    assert store.prune(30 * 86_400_000, dry_run=True) == len(others)
    with pytest.raises(TypeError, match="prefix"):
        store.prune(0, prefix=None)  # type: ignore[arg-type]


@pytest.fixture
def sqlite_database_store() -> Iterator[DatabaseStore]:
    store = DatabaseStore()
    store.prune(0)
    yield store
    store.clear()
    store.prune(0)
    store.close()


@pytest.mark.django_db(transaction=True)
def test_the_database_store_prunes_one_prefix_on_sqlite(sqlite_database_store):
    prune_scenario(sqlite_database_store, "default")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
def test_the_database_store_prunes_one_prefix_on_postgres(postgres_server):
    store = DatabaseStore("postgres")
    store.clear()
    store.prune(0)
    try:
        prune_scenario(store, "postgres")
    finally:
        store.clear()
        store.prune(0)
        store.close()


# reset_locks() and the configured service.


def test_reset_locks_frees_only_the_configured_prefix(settings: Any) -> None:
    settings.LOCKS = {"BACKEND": MEMORY, "KEY_PREFIX": "a:", "ALLOW_IN_MEMORY_STORAGE": True}
    store = locks.store
    take(store, "b:theirs")
    with locks.lock("ours") as lock:
        assert store.lease("a:ours") is not None
        reset_locks()
        assert not lock.held
    assert store.lease("a:ours") is None
    assert store.lease("b:theirs") is not None
    reset_locks(store)  # a store given: every lease of it
    assert store.lease("b:theirs") is None
