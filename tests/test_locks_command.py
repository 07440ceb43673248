"""``manage.py locks list|release|prune`` on the database store (PostgreSQL, SQLite) and on
Redis, the JSON output parsed; prune never lets a key's fencing token go back."""

from __future__ import annotations

import getpass
import io
import json
import logging
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connections

from django_locks.service import locks
from django_locks.stores.base import LockStore
from django_locks.stores.database.operations import SEQUENCE, TABLE
from tests.helpers import eventually

pytestmark = pytest.mark.django_db(transaction=True)
# The database store on PostgreSQL: the `postgres` alias exists only when such tests are selected.
ON_POSTGRES = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "postgres"]),
]


def run(*args: str, stdin: str | None = None) -> str:
    out = io.StringIO()
    options: dict[str, Any] = {"stdout": out, "stderr": io.StringIO()}
    if stdin is not None:
        options["stdin"] = io.StringIO(stdin)
    call_command("locks", *args, **options)
    return out.getvalue()


def listed(*flags: str) -> list[dict[str, Any]]:
    return list(json.loads(run("list", "--json", *flags)))


def key(name: str) -> str:
    return f"cli:{name}:{uuid.uuid4().hex[:8]}"


def configure(settings: Any, locks_setting: dict[str, Any]) -> Iterator[LockStore]:
    settings.LOCKS = locks_setting
    store = locks.store
    store.clear()
    yield store
    store.clear()
    store.close()


@pytest.fixture
def pg_store(settings: Any) -> Iterator[LockStore]:
    """The configured store: the database store on PostgreSQL."""
    options = {"using": "postgres"}
    yield from configure(
        settings, {"BACKEND": "django_locks.stores.DatabaseStore", "OPTIONS": options}
    )


@pytest.fixture
def redis_store(settings: Any, redis_server: Any) -> Iterator[LockStore]:
    """The configured store: the Redis store on the test redis-server."""
    options = {"url": redis_server.url}
    yield from configure(
        settings, {"BACKEND": "django_locks.stores.RedisStore", "OPTIONS": options}
    )


@pytest.fixture(
    params=[
        pytest.param("pg_store", marks=ON_POSTGRES),
        pytest.param("redis_store", marks=pytest.mark.redis),
    ]
)
def store(request: pytest.FixtureRequest) -> LockStore:
    """Each store in turn."""
    return request.getfixturevalue(request.param)  # type: ignore[no-any-return]


@pytest.fixture
def sqlite_store(settings: Any) -> Iterator[LockStore]:
    settings.LOCKS = {"BACKEND": "django_locks.stores.DatabaseStore"}
    store = locks.store
    yield store
    store.clear()
    store.close()


def in_every_state(store: LockStore) -> dict[str, tuple[str, int]]:
    """One held, one expired, one released lease: their (state, token) by key."""
    held, expired, released = key("held"), key("expired"), key("released")
    tokens = {
        held: store.acquire(held, "o1", 60_000),
        expired: store.acquire(expired, "o2", 60),
        released: store.acquire(released, "o3", 60_000),
    }
    store.release(released, "o3")
    eventually(lambda: expired not in {lease.key for lease in store.leases()}, what="expiry")
    states = {held: "held", expired: "expired", released: "released"}
    return {k: (states[k], int(token)) for k, token in tokens.items() if token is not None}


def test_list_json_held_and_with_all(store):
    leases = in_every_state(store)
    held = next(k for k, (state, _) in leases.items() if state == "held")
    [only] = listed()
    assert only["key"] == held
    assert only["state"] == "held"
    assert only["fencing_token"] == leases[held][1]
    assert "owner" not in only and "o1" not in json.dumps(only)  # the holder's secret
    assert isinstance(only["holder_info"]["pid"], int)
    assert only["holder"].startswith(f"{only['holder_info']['host']} pid ")  # the one-line label
    assert 0 < only["expires_in"] <= 60
    assert only["acquired_at"].endswith("+00:00")

    everything = {lease["key"]: lease for lease in listed("--all")}
    if store.__class__.__name__ == "RedisStore":
        # Redis forgets a lease once released or expired: --all lists the held ones.
        assert set(everything) == {held}
        return
    assert {k: (v["state"], v["fencing_token"]) for k, v in everything.items()} == leases
    assert [lease["state"] for lease in everything.values()] == ["held", "expired", "released"]
    expired = next(v for v in everything.values() if v["state"] == "expired")
    released = next(v for v in everything.values() if v["state"] == "released")
    assert expired["expires_in"] < 0
    assert released["expires_in"] is None


def test_list_as_a_table(store):
    held = key("table")
    token = store.acquire(held, "o1", 60_000)
    lines = run("list").splitlines()
    assert lines[0].split() == [
        "KEY",
        "STATE",
        "HOLDER",
        "TOKEN",
        "ACQUIRED",
        "AT",
        "LAST",
        "RENEWED",
        "EXPIRES",
        "IN",
    ]
    assert lines[1].split()[:2] == [held, "held"]
    assert str(token) in lines[1].split()


def test_release_with_yes_frees_the_key_and_keeps_its_token(store):
    held = key("release")
    token = store.acquire(held, "o1", 60_000)
    out = run("release", held, "--yes")
    assert f"Released '{held}'" in out and f"fencing token {token}" in out
    assert listed() == []
    again = store.acquire(held, "o2", 60_000)
    assert again is not None and token is not None and again > token


def test_release_asks_first(store):
    held = key("ask")
    store.acquire(held, "o1", 60_000)
    with pytest.raises(CommandError, match="Not released"):
        run("release", held, stdin="n\n")
    with pytest.raises(CommandError, match="no answer"):
        run("release", held, stdin="")
    assert [lease["key"] for lease in listed()] == [held]
    out = run("release", held, stdin="y\n")
    assert "[y/N]" in out and "Released" in out
    assert listed() == []


def test_release_of_a_key_nobody_holds_fails(store):
    with pytest.raises(CommandError, match="nothing"):
        run("release", key("free"), "--yes")


def test_release_says_a_key_is_free_before_asking(store):
    with pytest.raises(CommandError, match="No live lease") as raised:
        run("release", key("free"), stdin="y\n")
    assert "[y/N]" not in str(raised.value)


def test_release_leaves_an_audit_line_naming_who_released_what(store, caplog):
    held = key("audited")
    token = store.acquire(held, "secret-owner-id", 60_000)
    with caplog.at_level(logging.WARNING, logger="django_locks"):
        run("release", held, "--yes")
    [line] = [r.getMessage() for r in caplog.records if "locks release" in r.getMessage()]
    assert repr(held) in line and f"fencing token {token}" in line
    assert getpass.getuser() in line and socket.gethostname() in line
    assert "secret-owner-id" not in caplog.text


@pytest.mark.redis
def test_prune_on_redis_has_nothing_to_do(redis_store):
    assert "Nothing to prune" in run("prune", "--older-than", "30d")


def backdate(alias: str, keys: list[str], days: int) -> None:
    """Move the end of these leases ``days`` into the past (as if released that long ago)."""
    with connections[alias].cursor() as cursor:
        for name in keys:
            if connections[alias].vendor == "postgresql":
                cursor.execute(
                    f"UPDATE {TABLE} SET expires_at = expires_at - %s * interval '1 day', "
                    "released_at = released_at - %s * interval '1 day', "
                    "acquired_at = acquired_at - %s * interval '1 day' WHERE key = %s",
                    [days, days, days, name],
                )
            else:
                shift = f"-{days} days"
                cursor.execute(
                    f"UPDATE {TABLE} SET "
                    "expires_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', expires_at, %s), "
                    "released_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', released_at, %s) "
                    "WHERE key = %s",
                    [shift, shift, name],
                )


def rows(alias: str) -> set[str]:
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT key FROM {TABLE}")
        return {row[0] for row in cursor.fetchall()}


def prune_scenario(store: LockStore, alias: str) -> None:
    old_released, old_expired = key("old-released"), key("old-expired")
    recent, held = key("recent"), key("held")
    tokens = {name: store.acquire(name, "o1", 60_000) for name in (old_released, recent, held)}
    tokens[old_expired] = store.acquire(old_expired, "o1", 60)
    store.release(old_released, "o1")
    store.release(recent, "o1")
    backdate(alias, [old_released, old_expired], days=40)

    dry = run("prune", "--older-than", "30d", "--dry-run")
    assert "Would prune 2 leases" in dry and "nothing deleted" in dry
    assert {old_released, old_expired} <= rows(alias)
    out = run("prune", "--older-than", "30d")
    assert "Pruned 2 leases" in out
    assert {old_released, old_expired}.isdisjoint(rows(alias))
    assert {recent, held} <= rows(alias)
    # Re-acquired after the prune, the keys' tokens still go up.
    for name in (old_released, old_expired):
        again = store.acquire(name, "o2", 60_000)
        previous = tokens[name]
        assert again is not None and previous is not None and again > previous
    assert "Pruned 0 leases" in run("prune", "--older-than", "30d")
    # 0s: every lease that ended (the recent release), none held.
    assert "Pruned 1 lease " in run("prune", "--older-than", "0s")
    assert held in rows(alias)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
def test_prune_on_postgres_never_lets_a_token_go_back(pg_store):
    prune_scenario(pg_store, "postgres")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
def test_prune_after_a_sequence_reset_keeps_the_rows_floor(pg_store):
    """A sequence restored from a backup is behind the rows' tokens; a pruned row's token
    must still not come back (prune raises the sequence to it before deleting)."""
    store = pg_store
    name = key("reset")
    for _ in range(3):
        store.acquire(name, "o1", 60_000)
        store.release(name, "o1")
    with connections["postgres"].cursor() as cursor:
        cursor.execute("SELECT setval(%s, 1)", [SEQUENCE])
    floor = store.acquire(name, "o1", 60_000)  # floored by the row's own token
    store.release(name, "o1")
    backdate("postgres", [name], days=40)
    assert "Pruned 1 lease " in run("prune", "--older-than", "30d")
    again = store.acquire(name, "o2", 60_000)
    assert again is not None and floor is not None and again > floor


def test_prune_on_sqlite_never_lets_a_token_go_back(sqlite_store):
    prune_scenario(sqlite_store, "default")


def test_prune_needs_a_valid_duration(sqlite_store):
    with pytest.raises(CommandError, match="--older-than"):
        run("prune", "--older-than", "30 days")


def test_list_on_sqlite_json(sqlite_store):
    leases = in_every_state(sqlite_store)
    assert {v["key"]: (v["state"], v["fencing_token"]) for v in listed("--all")} == leases


# LOCKS["KEY_PREFIX"]: another project's leases share the store.


@pytest.fixture(
    params=[
        pytest.param("default", id="sqlite"),
        pytest.param("postgres", marks=ON_POSTGRES, id="postgres"),
        pytest.param("redis", marks=pytest.mark.redis, id="redis"),
    ]
)
def prefixed(request: pytest.FixtureRequest, settings: Any) -> Iterator[LockStore]:
    """The configured store under the key prefix ``a:``, holding ``a:report`` and ``a:export``
    (ours), ``b:report`` (another project's) and ``report`` (one without a prefix)."""
    if request.param == "redis":
        url = request.getfixturevalue("redis_server").url
        setting = {"BACKEND": "django_locks.stores.RedisStore", "OPTIONS": {"url": url}}
    else:
        options = {"using": request.param}
        setting = {"BACKEND": "django_locks.stores.DatabaseStore", "OPTIONS": options}
    settings.LOCKS = {**setting, "KEY_PREFIX": "a:"}
    store = locks.store
    store.clear()
    for name in ("a:report", "a:export", "b:report", "report"):
        assert store.acquire(name, f"owner-{name}", 60_000) is not None
    yield store
    store.clear()
    if store.keeps_ended_leases:
        store.prune(0)
    store.close()


def test_list_shows_only_the_prefixs_keys_without_it(prefixed):
    assert [lease["key"] for lease in listed()] == ["export", "report"]
    assert [lease["key"] for lease in listed("--all")] == ["export", "report"]
    lines = run("list").splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["export", "report"]
    prefixed.force_release("a:export")
    prefixed.force_release("a:report")
    out, err = io.StringIO(), io.StringIO()
    call_command("locks", "list", stdout=out, stderr=err)
    assert "No held lease in " in err.getvalue()
    assert "(keys of LOCKS['KEY_PREFIX'] 'a:')" in err.getvalue()


def test_release_frees_the_prefixs_key_only(prefixed, caplog):
    with caplog.at_level(logging.WARNING, logger="django_locks"):
        out = run("release", "report", "--yes")
    assert "Released 'report'" in out
    assert prefixed.lease("a:report") is None
    assert prefixed.lease("b:report") is not None and prefixed.lease("report") is not None
    assert prefixed.lease("a:export") is not None
    [line] = [r.getMessage() for r in caplog.records if "locks release" in r.getMessage()]
    assert "'report'" in line and "a:report" not in line
    # Another project's key is not this project's to release: it is looked up under a:.
    with pytest.raises(CommandError, match="No live lease on 'b:report'"):
        run("release", "b:report", "--yes")
    assert prefixed.lease("b:report") is not None
    with pytest.raises(CommandError, match="with the key prefix 'a:' counted"):
        run("release", "k" * 499, "--yes")


def test_prune_removes_only_the_prefixs_rows(prefixed):
    if not prefixed.keeps_ended_leases:
        assert "Nothing to prune" in run("prune", "--older-than", "0s")
        return
    for name in ("a:report", "b:report", "report"):
        prefixed.release(name, f"owner-{name}")
    alias = prefixed.using
    backdate(alias, ["a:report", "b:report", "report"], days=40)
    dry = run("prune", "--older-than", "30d", "--dry-run")
    assert "Would prune 1 lease " in dry and "(keys of LOCKS['KEY_PREFIX'] 'a:')" in dry
    assert "Pruned 1 lease " in run("prune", "--older-than", "30d")
    assert rows(alias) >= {"b:report", "report", "a:export"}
    assert "a:report" not in rows(alias)
    assert "Pruned 0 leases" in run("prune", "--older-than", "0s")


@pytest.mark.parametrize(
    "subcommand", [["list"], ["list", "--all"], ["prune", "--older-than", "1d"]]
)
def test_djangos_common_options_are_taken_after_the_subcommand(subcommand: list[str]) -> None:
    """``manage.py locks list --settings mysite.other``, as every command takes them at its end
    (ManagementUtility applies --settings before the command's parser sees it)."""
    import os
    import subprocess
    import sys

    from tests.children.env import child_env

    env = child_env()
    env.pop("DJANGO_SETTINGS_MODULE", None)
    args = [*subcommand, "--settings", "tests.settings", "-v", "0", "--traceback"]
    done = subprocess.run(
        [sys.executable, "-m", "django", "locks", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.fspath(os.path.dirname(os.path.dirname(__file__))),
    )
    assert done.returncode == 0, done.stderr
    assert "unrecognized arguments" not in done.stderr
