"""LOCKS is validated at startup without I/O; checks report it; override_settings rebuilds."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_locks import conf, locks
from django_locks.stores import InMemoryStore
from django_locks.testing import ManualClock
from tests.children.env import child_env

MEMORY = "django_locks.stores.InMemoryStore"


def ready() -> None:
    apps.get_app_config("django_locks").ready()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"BACKEND": "no.such.Store"}, "cannot be imported"),
        ({"BACKEND": "django_locks.lock.Lock"}, "is not a LockStore subclass"),
        ({"BACKEND": MEMORY, "OPTIONS": {"colour": "red"}}, "LOCKS['OPTIONS'] has 'colour', which"),
        ({"BACKEND": MEMORY, "TTL": "5x"}, "`LOCKS['TTL']` must be a positive duration"),
        ({"BACKEND": MEMORY, "MIN_HOLD": -1}, "`LOCKS['MIN_HOLD']` must be a non-negative"),
        ({"TTL": "30s", "TIMEOUT": 5}, "unknown keys ['TIMEOUT']"),
        ({"BACKEND": MEMORY, "CLOCK": 42}, "LOCKS['CLOCK'] must be None"),
        ({"BACKEND": MEMORY, "ALLOW_IN_MEMORY_STORAGE": "yes"}, "must be True or False"),
        ({"BACKEND": MEMORY, "METRICS": "prometheus"}, "must be a list of exporter names"),
        ({"BACKEND": MEMORY, "METRICS": None}, "for example LOCKS['METRICS'] = ['prometheus']"),
        ({"BACKEND": MEMORY, "METRICS": ["statsd"]}, "names 'statsd'; the exporters are"),
        ({"BACKEND": MEMORY, "METRICS": [1]}, "names 1; the exporters are 'opentelemetry'"),
        ({"BACKEND": MEMORY, "METRICS": ["prometheus"] * 2}, "names an exporter twice"),
        ({"BACKEND": MEMORY, "KEY_PREFIX": 1}, "`LOCKS['KEY_PREFIX']` must be a str"),
        ({"BACKEND": MEMORY, "KEY_PREFIX": "x" * 401}, "`LOCKS['KEY_PREFIX']` must be at most 400"),
        ({"BACKEND": MEMORY, "MAX_HOLD": "1ms"}, "`LOCKS['MAX_HOLD']` must be None or a positive"),
    ],
)
def test_bad_settings_refuse_to_start_with_the_fix(value, message) -> None:
    with override_settings(LOCKS=value), pytest.raises(ImproperlyConfigured) as caught:
        ready()
    assert message in str(caught.value)


def test_the_in_memory_store_is_refused_in_production_unless_allowed() -> None:
    with override_settings(DEBUG=False, LOCKS={"BACKEND": MEMORY}):
        with pytest.raises(ImproperlyConfigured, match="ALLOW_IN_MEMORY_STORAGE"):
            ready()
    with override_settings(DEBUG=True, LOCKS={"BACKEND": MEMORY}):
        ready()
    with override_settings(DEBUG=False, LOCKS={"BACKEND": MEMORY, "ALLOW_IN_MEMORY_STORAGE": True}):
        ready()


def test_override_settings_rebuilds_the_service_without_the_refusal() -> None:
    before = locks.store
    clock = ManualClock()
    with override_settings(DEBUG=False, LOCKS={"BACKEND": MEMORY, "TTL": "7s", "CLOCK": clock}):
        assert locks.store is not before
        assert locks.ttl_ms == 7000 and locks.clock is clock
        with locks.lock("k") as lock:
            assert lock.ttl == 7
    assert locks.ttl_ms == 30_000


def test_a_store_that_takes_the_clock_is_given_it_and_not_warped_too() -> None:
    """The in-memory store runs on LOCKS["CLOCK"]: a second move by warp() would expire its
    leases at half their ttl."""
    clock = ManualClock()
    with override_settings(LOCKS={"BACKEND": MEMORY, "CLOCK": clock}):
        store = locks.store
        assert store.acquire("moved-once", "owner", 10_000) is not None
        clock.advance("6s")
        assert store.acquire("moved-once", "other", 10_000) is None, "6 s of a 10 s lease"
        clock.advance("5s")
        assert store.acquire("moved-once", "other", 10_000) is not None


@pytest.mark.django_db(transaction=True)
def test_a_server_store_travels_with_a_manual_clock_in_the_setting() -> None:
    clock = ManualClock()
    backend = {"BACKEND": "django_locks.stores.DatabaseStore", "CLOCK": clock}
    with override_settings(LOCKS=backend):
        store = locks.store
        assert not isinstance(store, InMemoryStore)
        assert store.acquire("travels", "owner", 30_000) is not None
        clock.advance("29s")
        assert store.acquire("travels", "other", 30_000) is None
        clock.advance("2s")  # expired on the database's clock, with no sleeping
        assert store.acquire("travels", "other", 30_000) is not None


def test_a_real_startup_refuses_the_in_memory_store_with_debug_false(tmp_path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tests.children.in_memory_startup"],
        capture_output=True,
        text=True,
        check=True,
        env=child_env(),
    )
    assert out.stdout.startswith("ImproperlyConfigured"), out.stdout + out.stderr
    assert "only protects one process" in out.stdout


def test_checks_report_bad_settings_and_the_in_memory_store_under_deploy() -> None:
    with override_settings(LOCKS={"BACKEND": "no.such.Store"}):
        with pytest.raises(SystemCheckError, match="django_locks.E001"):
            call_command("check")
    with override_settings(DEBUG=False, LOCKS={"BACKEND": MEMORY}):
        call_command("check")  # not a deploy check: test runners set DEBUG = False
    for debug in (False, True):
        with override_settings(DEBUG=debug, LOCKS={"BACKEND": MEMORY}):
            with pytest.raises(SystemCheckError, match="django_locks.E002"):
                call_command("check", "--deploy", "--fail-level", "ERROR", "--tag", "django_locks")
    allowed = {"BACKEND": MEMORY, "ALLOW_IN_MEMORY_STORAGE": True}
    with override_settings(LOCKS=allowed):
        call_command("check", "--deploy", "--fail-level", "ERROR", "--tag", "django_locks")


def test_settings_are_read_once_and_reset_on_change() -> None:
    first = conf.get()
    assert conf.get() is first
    with override_settings(LOCKS={"BACKEND": MEMORY, "TTL": "1m"}):
        assert conf.get().ttl_ms == 60_000
    assert conf.get().ttl_ms == 30_000
    assert isinstance(conf.build_store(conf.get()), InMemoryStore)


@pytest.mark.django_db  # newer Django versions run database checks under a plain `check`
def test_the_stores_own_check_ids_show_through_manage_py_check(capsys) -> None:
    db = "django_locks.stores.DatabaseStore"
    with override_settings(LOCKS={"BACKEND": db, "OPTIONS": {"using": "nope"}}):
        with pytest.raises(SystemCheckError, match="django_locks.E101"):
            call_command("check")
    with override_settings(DEBUG=False, LOCKS={"BACKEND": db}):
        call_command("check")  # a warning only
    assert "django_locks.W101" in capsys.readouterr().err
