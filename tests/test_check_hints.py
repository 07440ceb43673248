"""System checks on day one: each problem said once, and a hint that, followed, makes it go."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connections
from django.test import override_settings

from django_locks import conf
from django_locks.exceptions import StoreError
from django_locks.stores.database import DatabaseStore

DATABASE_STORE = "django_locks.stores.DatabaseStore"
MEMORY = "django_locks.stores.InMemoryStore"


def run_check(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    call_command("check", *args)
    captured = capsys.readouterr()
    return captured.out + captured.err


@pytest.fixture
def project_debug() -> Iterator[None]:
    """As under `manage.py test`: the settings say DEBUG = True, the runner set it to False."""
    conf.remember_debug(True)
    previous = settings.DEBUG
    settings.DEBUG = False
    yield
    settings.DEBUG = previous
    conf.remember_debug(previous)


@pytest.mark.django_db
def test_check_deploy_says_w101_once(capsys) -> None:
    with override_settings(DEBUG=False, LOCKS={"BACKEND": DATABASE_STORE}):
        out = run_check(capsys, "--deploy", "--tag", "django_locks")
    assert out.count("(django_locks.W101)") == 1, out


@pytest.mark.django_db
def test_w101_follows_the_settings_debug_not_the_test_runners(capsys, project_debug) -> None:
    with override_settings(LOCKS={"BACKEND": DATABASE_STORE}):
        assert "W101" not in run_check(capsys, "--tag", "django_locks")
        conf.remember_debug(False)  # a project whose settings say DEBUG = False
        assert "W101" in run_check(capsys, "--tag", "django_locks")


def test_e002_hint_tells_the_fix_whatever_debug_is(capsys) -> None:
    from django.core.management.base import SystemCheckError

    for debug in (True, False):
        with override_settings(DEBUG=debug, LOCKS={"BACKEND": MEMORY}):
            with pytest.raises(SystemCheckError) as raised:
                call_command("check", "--deploy", "--tag", "django_locks")
        text = str(raised.value)
        assert text.count("django_locks.E002") == 1
        assert "DEBUG is False" not in text
        assert "django_locks.stores.DatabaseStore" in text
        assert "django_locks.stores.EtcdStore" in text


def follow(hint: str, using: str) -> None:
    """Do what a hint says: run its `manage.py ...` commands, its SQL in a dbshell."""
    for command in re.findall(r"`manage\.py ([^`]+)`", hint):
        words = shlex.split(command)
        if words[0] == "dbshell":
            continue
        call_command(*words, verbosity=0)
    for sql in re.findall(r"run `([^`]+;)`", hint):
        with connections[using].cursor() as cursor:
            for statement in filter(None, (part.strip() for part in sql.split(";"))):
                cursor.execute(statement)


def w102(capsys: pytest.CaptureFixture[str], using: str) -> list[str]:
    out = run_check(capsys, "--database", using, "--tag", "django_locks")
    return [line for line in out.splitlines() if "W102" in line or "HINT" in line]


BREAKAGES = {
    "table": ["DROP TABLE django_locks_lease"],
    "functions": [
        "DROP FUNCTION django_locks_acquire(text, text, text, bigint)",
        "DROP FUNCTION django_locks_release(text, text)",
    ],
    "sequence": ["DROP SEQUENCE django_locks_lease_fencing_token_seq"],
    # One of 0007's two columns: applying 0007 again would fail on the other.
    "tick column": ["ALTER TABLE django_locks_lease DROP COLUMN tick_token"],
}


@pytest.mark.postgres
@pytest.mark.django_db(databases=["default", "postgres"], transaction=True)
@pytest.mark.parametrize("broken", sorted(BREAKAGES))
def test_w102_hint_repairs_what_migrate_alone_does_not(capsys, broken) -> None:
    options = {"BACKEND": DATABASE_STORE, "OPTIONS": {"using": "postgres"}}
    with override_settings(LOCKS=options):
        assert w102(capsys, "postgres") == []
        with connections["postgres"].cursor() as cursor:
            for statement in BREAKAGES[broken]:
                cursor.execute(statement)
        lines = w102(capsys, "postgres")
        assert sum("W102" in line for line in lines) == 1, lines
        hint = next(line for line in lines if "HINT" in line)
        call_command("migrate", "django_locks", database="postgres", verbosity=0)
        assert w102(capsys, "postgres"), "a plain migrate leaves it (the records say it ran)"
        follow(hint, "postgres")
        assert w102(capsys, "postgres") == [], hint
        store = DatabaseStore("postgres")
        try:
            assert store.acquire("repaired", "someone", 1000) is not None
        finally:
            store.close()


@pytest.mark.django_db(transaction=True)
def test_an_unmigrated_database_says_run_migrate() -> None:
    with connections["default"].cursor() as cursor:
        cursor.execute("ALTER TABLE django_locks_lease RENAME TO django_locks_lease_away")
    try:
        with pytest.raises(StoreError, match=r"run `manage\.py migrate django_locks"):
            DatabaseStore("default").acquire("k", "someone", 1000)
    finally:
        with connections["default"].cursor() as cursor:
            cursor.execute("ALTER TABLE django_locks_lease_away RENAME TO django_locks_lease")


@pytest.mark.parametrize(
    ("backend", "options", "valid"),
    [
        (
            DATABASE_STORE,
            {"usng": "default"},
            "'listen_using', 'max_connections', 'timeout', 'using'",
        ),
        (
            "django_locks.stores.RedisStore",
            {"url": "redis://", "sockettimeout": 1},
            "'socket_timeout'",
        ),
    ],
)
def test_an_unknown_option_is_named_with_the_valid_ones(backend, options, valid) -> None:
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured) as raised:
        conf.build_store(conf.read({"BACKEND": backend, "OPTIONS": options}))
    message = str(raised.value)
    assert repr(next(iter(set(options) - {"url"}))) in message
    assert valid in message
    assert "unexpected keyword" not in message


REDIS_DOWN = {
    "BACKEND": "django_locks.stores.RedisStore",
    "OPTIONS": {"url": "redis://127.0.0.1:1/0", "socket_connect_timeout": 0.3},
}


@pytest.mark.parametrize(
    ("args", "said"),
    [
        # Django hands every alias to every check as `databases` when none was asked for: a
        # plain check (and every command's own checks) must not reach the store.
        ((), 0),
        (("--database", "default"), 1),
        (("--deploy",), 1),
        (("--deploy", "--database", "default"), 1),
    ],
    ids=["plain", "database", "deploy", "deploy and database"],
)
@pytest.mark.django_db
def test_the_store_is_reached_only_by_check_database_or_deploy_and_said_once(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], said: int
) -> None:
    with override_settings(DEBUG=True, LOCKS=REDIS_DOWN):
        out = run_check(capsys, *args)
    assert out.count("(django_locks.W206)") == said, out


@pytest.mark.parametrize("order", ["as registered", "reversed"])
@pytest.mark.parametrize(
    "args",
    [("--deploy", "--database", "default"), ("--database", "default"), ("--deploy",)],
    ids=["deploy and database", "database", "deploy"],
)
@pytest.mark.django_db
def test_each_finding_is_said_once_in_whatever_order_django_runs_the_checks(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: tuple[str, ...],
    order: str,
) -> None:
    # Django keeps registered checks in a set: their order differs from one process to the next.
    from django.core.checks.registry import registry

    def get_checks(include_deployment_checks: bool = False) -> list[Any]:
        ours = sorted(
            (c for c in registry.registered_checks if c.__module__ == "django_locks.checks"),
            key=lambda c: str(getattr(c, "__name__", "")),
            reverse=order == "reversed",
        )
        deploy = [c for c in registry.deployment_checks if c.__module__ == "django_locks.checks"]
        return ours + (deploy if include_deployment_checks else [])

    monkeypatch.setattr(registry, "get_checks", get_checks)
    with override_settings(DEBUG=True, LOCKS=REDIS_DOWN):
        # A database-only run first must not silence a later deploy run's finding.
        run_check(capsys, "--database", "default")
        out = run_check(capsys, *args)
    assert out.count("(django_locks.W206)") == 1, out
