"""The operator's probes on real servers: ``manage.py locks health`` (exit status, one line per
check with its fix, a hung store timing out), ``locks list --watch`` (refreshes, a store error
and its fix, SIGINT), and the django-health-check backend through its own view."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import gc
import io
import json
import os
import pty
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connections
from django.test import RequestFactory
from health_check.views import HealthCheckView  # type: ignore[import-untyped]

from django_locks import health
from django_locks.contrib.health_check import Locks as LocksCheck
from django_locks.service import locks
from tests.children.env import child_env
from tests.helpers import eventually
from tests.servers import free_port
from tests.testapp.leaders import KEY as WRITER
from tests.testapp.leaders import STUBBORN

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.django_db(transaction=True)
ON_POSTGRES = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "postgres"]),
]
STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00"


def redis_locks(url: str, **options: Any) -> dict[str, Any]:
    return {"BACKEND": "django_locks.stores.RedisStore", "OPTIONS": {"url": url, **options}}


def postgres_env() -> dict[str, Any]:
    """The `postgres` alias for a child's settings."""
    settings_dict = connections["postgres"].settings_dict
    return {name: settings_dict[name] for name in ("ENGINE", "NAME", "USER", "HOST", "PORT")}


@pytest.fixture
def configured(settings: Any) -> Iterator[Any]:
    """``configure(LOCKS)``: this process's service on that store, and the environment of a
    ``manage.py`` child on the same store."""
    stores: list[Any] = []

    def configure(locks_setting: dict[str, Any]) -> dict[str, str]:
        settings.LOCKS = locks_setting
        stores.append(locks.store)
        using = locks_setting.get("OPTIONS", {}).get("using")
        postgres = postgres_env() if using == "postgres" else None
        return child_env(settings="tests.leader_settings", locks=locks_setting, postgres=postgres)

    yield configure
    for store in stores:
        with contextlib.suppress(Exception):  # a server a test stopped
            store.clear()
        store.close()


@pytest.fixture(
    params=[
        pytest.param("postgres", marks=ON_POSTGRES),
        pytest.param("redis", marks=pytest.mark.redis),
    ]
)
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_env(store_kind: str, request: pytest.FixtureRequest, configured: Any) -> dict[str, str]:
    """Each server store in turn, configured here and for the child."""
    if store_kind == "postgres":
        setting = {"BACKEND": "django_locks.stores.DatabaseStore", "OPTIONS": {"using": "postgres"}}
        return configured(setting)  # type: ignore[no-any-return]
    return configured(redis_locks(request.getfixturevalue("redis_server").url))  # type: ignore[no-any-return]


def locks_command(env: dict[str, str], *args: str, timeout: float = 60) -> tuple[int, str, float]:
    """``python -m django locks ARGS`` in a child: its exit status, its output, its seconds."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "django", "locks", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def line_of(out: str, start: str) -> str:
    [line] = [line for line in out.splitlines() if line.startswith(start)]
    return line


# locks health


def test_health_exits_0_when_every_election_is_led_and_1_naming_the_fix_when_one_is_not(
    store_env,
):
    writer = locks.acquire(WRITER, ttl="60s")
    stubborn = locks.acquire(STUBBORN, ttl="60s")
    assert writer is not None and stubborn is not None
    code, out, _ = locks_command(store_env, "health")
    assert code == 0, out
    lines = out.splitlines()
    assert re.fullmatch(r'store (PostgreSQL "postgres"|Redis \S+): ok \([\d.]+ ms\)', lines[0])
    led = line_of(out, f"election {WRITER!r}: led by ")
    assert f" pid {os.getpid()} " in led and f"(fencing token {writer.fencing_token})" in led
    assert "fix" not in out

    stubborn.release()
    code, out, _ = locks_command(store_env, "health")
    assert code == 1, out
    assert line_of(out, f"election {WRITER!r}: led by ")
    assert line_of(out, f"election {STUBBORN!r}: ") == (
        f"election {STUBBORN!r}: no leader: no process holds its lease; fix: start `manage.py "
        f"run_leader {STUBBORN}` (or whatever campaigns for it) on at least one replica; if one "
        "runs, its log says why it does not lead"
    )
    assert "Unhealthy: 1 of 3 checks failed." in out
    writer.release()


@pytest.mark.redis
@pytest.mark.slow
def test_health_names_a_real_run_leader_as_the_leader(configured, redis_server):
    env = configured(redis_locks(redis_server.url))
    key = STUBBORN  # its work sleeps: nothing to set up for it
    leader = subprocess.Popen(
        [sys.executable, "-m", "django", "run_leader", key, "--grace", "0s"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        eventually(lambda: locks.store.lease(key) is not None, timeout=30, what="a leader")
        code, out, _ = locks_command(env, "health", "--skip-registered", "--election", key)
        assert code == 0, out
        led = line_of(out, f"election {key!r}: led by ")
        assert f" pid {leader.pid} (run_leader {key}) since " in led, led
    finally:
        leader.kill()
        leader.wait(10)


@pytest.mark.redis
def test_health_on_a_closed_port_fails_with_the_fix(configured):
    env = configured(redis_locks(f"redis://127.0.0.1:{free_port()}/0"))
    code, out, _ = locks_command(env, "health")
    assert code == 1, out
    store_line = out.splitlines()[0]
    assert re.fullmatch(
        r"store Redis 127\.0\.0\.1:\d+/0: error: .*Connection refused; fix: check that the "
        r"server is running and reachable from this host, and that LOCKS\['OPTIONS'\] points "
        r"at it",
        store_line,
    ), store_line
    # The elections are not asked about a store that did not answer.
    assert line_of(out, f"election {WRITER!r}: ").endswith(
        "not checked: the store check failed; fix: see the store's line"
    )
    assert "Unhealthy: 1 of 3 checks failed, 2 not checked." in out


@pytest.mark.redis
@pytest.mark.slow
def test_health_on_a_paused_server_times_out_and_on_a_killed_one_fails(
    configured, make_redis_server
):
    server = make_redis_server()
    # Its own socket timeout is long: only the probe's --timeout can end the wait in time.
    env = configured(redis_locks(server.url, socket_timeout="30s"))
    code, out, healthy_run = locks_command(env, "health", "--skip-registered")
    assert code == 0, out
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        code, out, seconds = locks_command(env, "health", "--timeout", "1s")
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    assert code == 1, out
    assert re.match(
        r"store Redis \S+: no answer within 1s; fix: check that the server is up and not "
        "paused or overloaded",
        out,
    ), out
    # One second more than a healthy run (the interpreter's start), far from the 30 s.
    assert seconds < healthy_run + 1 + 2, (seconds, healthy_run)
    server.kill()
    code, out, _ = locks_command(env, "health", "--skip-registered")
    assert code == 1 and "Connection refused; fix: " in out, out


@pytest.mark.redis
def test_health_expects_the_beats_election_with_celery_beat_leader(configured, redis_server):
    from celery import Celery

    configured({**redis_locks(redis_server.url), "CELERY_BEAT_LEADER": True})
    app = Celery("health-beat", set_as_current=False)
    try:
        expected = health.elections()
        assert expected["celery-beat:health-beat"] == "celery beat (CELERY_BEAT_LEADER)"
        assert {WRITER, STUBBORN} <= set(expected)
        [beat] = [c for c in health.run(expected) if c.name == "celery-beat:health-beat"]
        assert not beat.ok
        assert str(beat).startswith(
            "election 'celery-beat:health-beat': no leader: no process holds its lease; fix: "
            "start `celery beat` on at least one replica with LOCKS['CELERY_BEAT_LEADER'] on"
        )
        lock = locks.acquire("celery-beat:health-beat", ttl="60s")
        assert lock is not None
        [beat] = [c for c in health.run(expected) if c.name == "celery-beat:health-beat"]
        assert beat.ok and beat.fencing_token == lock.fencing_token
        lock.release()
        # A beat key given on the command line stands for the beat's election.
        given = health.elections(["celery-beat:other"])
        assert not any(k == "celery-beat:health-beat" for k in given)
        assert given["celery-beat:other"] == "--election"
    finally:
        del app
        gc.collect()


def run_health(*args: str) -> tuple[str, CommandError | None]:
    out = io.StringIO()
    try:
        call_command("locks", "health", *args, stdout=out, stderr=io.StringIO())
    except CommandError as exc:
        return out.getvalue(), exc
    return out.getvalue(), None


@pytest.mark.redis
def test_health_refuses_bad_options_before_any_store_call(configured):
    configured(redis_locks(f"redis://127.0.0.1:{free_port()}/0"))  # would fail if asked
    for args, named in [
        (["--timeout", "0"], "--timeout"),
        (["--timeout", "soon"], "--timeout"),
        (["--election", ""], "--election"),
    ]:
        out, error = run_health(*args)
        assert error is not None and error.returncode == 2, args
        assert named in str(error) and out == ""
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        health.run({}, timeout=0)
    with pytest.raises(TypeError, match="timeout must be a number of seconds, got '3s'"):
        health.run({}, timeout="3s")  # type: ignore[arg-type]


@pytest.mark.redis
def test_health_json(configured, redis_server):
    configured(redis_locks(redis_server.url))
    key = f"health:json:{uuid.uuid4().hex[:8]}"
    lock = locks.acquire(key, ttl="60s")
    assert lock is not None
    out, error = run_health("--json", "--skip-registered", "--election", key)
    assert error is None
    document = json.loads(out)
    assert document["healthy"] is True
    store, election = document["checks"]
    assert store["check"] == "store" and store["ok"] and store["ms"] > 0
    assert election["name"] == key and election["source"] == "--election"
    assert election["fencing_token"] == lock.fencing_token
    assert f"pid {os.getpid()}" in election["leader"]
    lock.release()
    out, error = run_health("--json", "--skip-registered", "--election", key)
    assert error is not None and error.returncode == 1
    document = json.loads(out)
    assert document["healthy"] is False
    assert document["checks"][1]["status"] == "no leader: no process holds its lease"
    assert document["checks"][1]["fix"].startswith(f"start `manage.py run_leader {key}`")


# The django-health-check backend


def through_the_view(*checks: Any) -> tuple[int, dict[str, str]]:
    """GET django-health-check's own view, configured with ``checks``, as JSON."""
    view = HealthCheckView.as_view(checks=list(checks))
    request = RequestFactory().get("/health/", {"format": "json"})
    response = asyncio.run(view(request))
    return response.status_code, json.loads(response.content)


@pytest.mark.redis
def test_the_health_check_backend_through_its_view_and_api(configured, redis_server):
    configured(redis_locks(redis_server.url))
    key = f"health:backend:{uuid.uuid4().hex[:8]}"
    options: dict[str, Any] = {"elections": [key], "skip_registered": True}
    check = ("django_locks.contrib.health_check.Locks", options)
    name = f"Locks(elections=[{key!r}], skip_registered=True)"

    status, report = through_the_view(check)
    assert status == 500
    assert report[name].startswith(
        f"Unavailable: election {key!r}: no leader: no process holds its lease; fix: start "
    )
    lock = locks.acquire(key, ttl="60s")
    assert lock is not None
    assert through_the_view(check) == (200, {name: "OK"})
    result = asyncio.run(LocksCheck(**options).get_result())
    assert result.error is None
    lock.release()
    # The elections registered in code count too, unless skipped.
    result = asyncio.run(LocksCheck().get_result())
    assert result.error is not None and f"election {STUBBORN!r}: no leader" in str(result.error)
    with pytest.raises(ValueError, match="elections"):
        LocksCheck(elections=[""])


@pytest.mark.redis
@pytest.mark.slow
def test_the_health_check_backend_on_a_paused_store_fails_on_time(configured, make_redis_server):
    server = make_redis_server()
    configured(redis_locks(server.url, socket_timeout="30s"))
    check = LocksCheck(skip_registered=True, timeout=datetime.timedelta(seconds=1))
    assert asyncio.run(check.get_result()).error is None
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        result = asyncio.run(check.get_result())
        seconds = time.monotonic() - started
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    assert 1 <= seconds < 1.9, seconds  # ours, not django-health-check's own (its timeout + 1)
    assert str(result.error).startswith("Unavailable: store Redis ")
    assert "no answer within 1s; fix: " in str(result.error)
    server.kill()
    status, report = through_the_view(
        ("django_locks.contrib.health_check.Locks", {"skip_registered": True})
    )
    assert status == 500 and "Connection refused; fix: check that the server" in str(report)


# locks list --watch


class Watch:
    """``locks list --watch ARGS`` in a child, its output read as it comes."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "django", "locks", "list", "--watch", *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 20) -> int:
        """Wait until an output line matches ``pattern``; its index."""
        found: list[int] = []

        def seen() -> bool:
            found[:] = [i for i, line in enumerate(list(self.lines)) if re.search(pattern, line)]
            return bool(found)

        eventually(seen, timeout=timeout, what=lambda: f"{pattern!r} in:\n{self.text}", every=0.05)
        return found[0]

    def interrupt(self) -> tuple[int, str]:
        """SIGINT (Ctrl-C): the exit status and standard error."""
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(10)
        self.reader.join(5)
        assert self.proc.stderr is not None
        return code, self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def test_watch_shows_a_lock_taken_between_two_refreshes_and_ends_on_sigint(store_kind, store_env):
    on_postgres = store_kind == "postgres"
    key = f"watch:{uuid.uuid4().hex[:8]}"
    ended = f"watch:ended:{uuid.uuid4().hex[:8]}"
    watch = Watch(store_env, *(["--all"] if on_postgres else []))
    try:
        first = watch.wait_for(rf"^{STAMP}  \S.*: 0 held leases")
        if on_postgres:
            gone = locks.acquire(ended, ttl="60s")
            assert gone is not None
            gone.release()
        lock = locks.acquire(key, ttl="60s")
        assert lock is not None
        row = watch.wait_for(rf"^{re.escape(key)}\s+held\s")
        code, stderr = watch.interrupt()
    finally:
        watch.kill()
    assert code == 0, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    lines = watch.lines
    # Each refresh: its timestamped header, the listing, a blank line.
    headers = [i for i, line in enumerate(lines) if re.match(rf"{STAMP}  ", line)]
    assert len(headers) >= 2 and first == headers[0]
    assert all(lines[i - 1] == "" for i in headers[1:])
    assert lines[first + 1] == f"No held lease in {locks.store}." or on_postgres
    change = max(i for i in headers if i < row)
    assert re.match(rf"{STAMP}  .*: 1 held lease", lines[change])
    if on_postgres:
        assert any(re.match(rf"{re.escape(ended)}\s+released\s", line) for line in lines)
    assert lines[change + 1].split()[:2] == ["KEY", "STATE"]
    lock.release()


@pytest.mark.redis
def test_watch_json_is_one_document_a_line(configured, redis_server):
    env = configured(redis_locks(redis_server.url))
    key = f"watch:json:{uuid.uuid4().hex[:8]}"
    watch = Watch(env, "--json")
    try:
        watch.wait_for(r'"leases": \[\]')
        lock = locks.acquire(key, ttl="60s")
        assert lock is not None
        watch.wait_for(re.escape(json.dumps(key)))
        code, stderr = watch.interrupt()
    finally:
        watch.kill()
    assert code == 0 and "Traceback" not in stderr, stderr
    documents = [json.loads(line) for line in watch.lines]  # every line is one document
    assert all(set(doc) == {"at", "store", "leases"} for doc in documents)
    assert documents[0]["leases"] == []
    [held] = documents[-1]["leases"]
    assert held["key"] == key and held["fencing_token"] == lock.fencing_token
    lock.release()


@pytest.mark.redis
@pytest.mark.slow
def test_watch_shows_a_store_error_with_its_fix_and_goes_on(configured, make_redis_server):
    server = make_redis_server()
    env = configured(redis_locks(server.url))
    watch = Watch(env)
    try:
        watch.wait_for(r": 0 held leases")
        server.kill()
        failed = watch.wait_for(r": error: .*Connection refused")
        assert watch.lines[failed + 1].startswith("fix: check that the server is running")
        server.start()  # the same port and data directory
        lock = locks.acquire(f"watch:back:{uuid.uuid4().hex[:8]}", ttl="60s")
        assert lock is not None
        back = watch.wait_for(r": 1 held lease ")
        assert back > failed
        code, stderr = watch.interrupt()
    finally:
        watch.kill()
    assert code == 0 and "Traceback" not in stderr, stderr
    lock.release()


@pytest.mark.redis
def test_watch_on_a_terminal_clears_the_screen_between_refreshes(configured, redis_server):
    env = configured(redis_locks(redis_server.url))
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "django", "locks", "list", "--watch"],
        cwd=ROOT,
        env=env,
        stdout=terminal,
        stderr=subprocess.PIPE,
    )
    os.close(terminal)
    seen = b""
    try:
        deadline = time.monotonic() + 20
        while seen.count(b"\x1b[H\x1b[2J") < 2 and time.monotonic() < deadline:
            seen += os.read(controller, 4096)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(controller)
    assert seen.count(b"\x1b[H\x1b[2J") >= 2, seen
    assert b"Ctrl-C to stop" in seen


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"elections": "reports:nightly"}, TypeError, r"write \['reports:nightly'\]"),
        ({"elections": [""]}, ValueError, "elections"),
        ({"timeout": datetime.timedelta(0)}, ValueError, "`timeout` must be a positive"),
        ({"timeout": datetime.timedelta(days=400)}, ValueError, "at most 366 days"),
    ],
)
def test_the_backend_refuses_bad_options_where_it_is_configured(
    options: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        LocksCheck(**options)


# LOCKS["KEY_PREFIX"]: another project's leases share the store.


@pytest.fixture
def prefixed_memory(settings: Any) -> Iterator[Any]:
    """The in-memory store under the key prefix ``a:``; another project (``b:``) leads
    every election of this process in it."""
    settings.LOCKS = {
        "BACKEND": "django_locks.stores.InMemoryStore",
        "ALLOW_IN_MEMORY_STORAGE": True,
        "KEY_PREFIX": "a:",
    }
    store = locks.store
    for key in (WRITER, STUBBORN):
        assert store.acquire(f"b:{key}", f"theirs-{key}", 60_000) is not None
    yield store
    store.clear()


def test_health_looks_elections_up_under_the_prefix_only(prefixed_memory):
    """Another project's leaders are not this project's: its elections have none."""
    expected = {WRITER: "--election"}
    [store_check, election] = health.run(expected)
    assert store_check.ok
    assert not election.ok and election.status == "no leader: no process holds its lease"
    writer = locks.acquire(WRITER, ttl="60s")
    assert writer is not None and prefixed_memory.lease(f"a:{WRITER}") is not None
    [_, election] = health.run(expected)
    assert election.ok and election.fencing_token == writer.fencing_token
    out = io.StringIO()
    call_command("locks", "health", "--skip-registered", "--election", WRITER, stdout=out)
    assert f"election {WRITER!r}: led by " in out.getvalue()
    writer.release()
    with pytest.raises(CommandError, match="Unhealthy"):
        call_command(
            "locks", "health", "--skip-registered", "--election", WRITER, stdout=io.StringIO()
        )


def test_the_health_check_backend_ignores_another_projects_leaders(prefixed_memory):
    check = LocksCheck(elections=[STUBBORN], skip_registered=True)
    result = asyncio.run(check.get_result())
    assert result.error is not None and f"election {STUBBORN!r}: no leader" in str(result.error)
    lock = locks.acquire(STUBBORN, ttl="60s")
    assert lock is not None
    assert asyncio.run(check.get_result()).error is None
    lock.release()


def test_watch_lists_the_prefixs_keys_and_says_so(prefixed_memory):
    from django_locks.management import probes

    assert prefixed_memory.acquire("a:export", "ours", 60_000) is not None
    lines = probes._refresh(locks, False, False, threading.Event())
    assert "(keys of LOCKS['KEY_PREFIX'] 'a:'): 1 held lease " in lines[0]
    assert [line.split()[0] for line in lines[2:]] == ["export"]
