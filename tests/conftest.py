"""Fixtures shared by the whole suite; servers come from tests/servers/."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from typing import Any

import pytest

# The fast tox environments install django_locks without the redis extra: the Redis store's
# test modules (tests/stores/test_redis*.py) import redis-py, so they are left out there (their
# server tests are deselected by the `redis` marker anyway); test_contract.py imports it lazily.
if importlib.util.find_spec("redis") is None:
    collect_ignore_glob = ["stores/test_redis*.py"]


@pytest.fixture(scope="session")
def redis_server() -> Iterator[Any]:
    """One durable redis-server (AOF, appendfsync always, noeviction) for the whole session."""
    from tests.servers.redis import RedisServer

    server = RedisServer().start()
    yield server
    server.destroy()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[Any]:
    """A 3-master Redis Cluster on loopback for the whole session."""
    from tests.servers.redis import RedisClusterServers

    cluster = RedisClusterServers()
    try:
        cluster.start()
    except Exception:
        cluster.destroy()
        raise
    yield cluster
    cluster.destroy()


@pytest.fixture
def make_redis_server() -> Iterator[Any]:
    """Start per-test redis-servers (``make_redis_server(config)``); their logs on failure."""
    from tests.servers import dump_log
    from tests.servers.redis import RedisServer

    servers: list[Any] = []

    def make(config: dict[str, str] | None = None, extra: tuple[str, ...] = ()) -> Any:
        server = RedisServer(config, extra=extra)
        servers.append(server)
        return server.start()

    yield make
    for server in servers:
        # Printed during teardown: pytest shows it only for a failed test.
        print(f"--- {server.log} ---\n{dump_log(server.log)}")
        server.destroy()


@pytest.fixture(scope="session")
def etcd_cluster() -> Iterator[Any]:
    """The throwaway three-member etcd cluster on loopback (tests/servers/etcd.py), started once
    for the session; a missing /usr/bin/etcd skips, or fails under CI=true."""
    from tests.servers.etcd import EtcdCluster

    cluster = EtcdCluster()
    try:
        cluster.start()
    except Exception:
        cluster.destroy()
        raise
    yield cluster
    cluster.destroy()


@pytest.fixture
def etcd(etcd_cluster: Any) -> Iterator[Any]:
    """The session's etcd cluster, whole: every member running and resumed, and a leader, before
    and after the test (which may kill, stop or pause members); the members' logs on failure."""
    etcd_cluster.heal()
    yield etcd_cluster
    # Printed during teardown: pytest shows it only for a failed test.
    print(etcd_cluster.logs(lines=30))
    etcd_cluster.heal()


# PostgreSQL and PgBouncer (tests/servers/postgres.py): started once collection (and -m / -k
# deselection) is done and only when selected tests carry the `postgres` / `pgbouncer` markers,
# so that their DATABASES aliases exist before pytest-django creates the test databases.


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from tests.servers import postgres

    _deselect_tasks(config, items)

    wanted = {"postgres", "pgbouncer"}
    postgres.start_for({m.name for item in items for m in item.iter_markers() if m.name in wanted})


# django.tasks tests (marker `tasks`): they need django.tasks (Django 6.0+) or the django-tasks
# backport, and django-tasks-db, which `make test`'s virtualenv (Django 5.2) does not install.
# There they are deselected, as `-m "not tasks"` would, and the summary says where they run (the
# two tasks tox environments, which .ci/run runs): never skipped, so nothing counts a test that
# did not run. In those environments (DJANGO_LOCKS_TASKS_REQUIRED=1) a missing one fails.
TASKS_REQUIRED = os.environ.get("DJANGO_LOCKS_TASKS_REQUIRED", "") == "1"

# The testing example of docs/topics/tasks.rst is written for Django 6.0's django.tasks (its
# backend paths are django.tasks.backends.*): collected only where that is installed.
collect_ignore = (
    [] if importlib.util.find_spec("django.tasks") else ["test_tasks_testing_example.py"]
)
_tasks_deselected: list[str] = []


def _deselect_tasks(config: pytest.Config, items: list[pytest.Item]) -> None:
    if TASKS_REQUIRED or tasks_missing() is None:
        return
    kept = [item for item in items if item.get_closest_marker("tasks") is None]
    gone = [item for item in items if item.get_closest_marker("tasks") is not None]
    if gone:
        config.hook.pytest_deselected(items=gone)
        items[:] = kept
        _tasks_deselected.append(
            f"{len(gone)} django.tasks tests deselected: {tasks_missing()}; they run in "
            "tox -e py312-django60-tasks,py312-django52-tasks (.ci/run runs both)"
        )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in _tasks_deselected:
        terminalreporter.write_line(line)


def tasks_missing() -> str | None:
    """Why the django.tasks tests cannot run here, else None."""
    if importlib.util.find_spec("django_tasks_db") is None:
        return "django-tasks-db is not installed (tox -e py312-django60-tasks runs these tests)"
    if importlib.util.find_spec("django.tasks") is None and not importlib.util.find_spec(
        "django_tasks"
    ):
        return "neither django.tasks (Django 6.0+) nor the django-tasks backport is installed"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    from tests.servers import missing, postgres

    if item.get_closest_marker("tasks") is not None:
        reason = tasks_missing()
        if reason is not None:  # only with DJANGO_LOCKS_TASKS_REQUIRED: deselected otherwise
            pytest.fail(f"{reason} (DJANGO_LOCKS_TASKS_REQUIRED=1)", pytrace=False)

    for name in ("pgbouncer", "postgres"):
        if item.get_closest_marker(name) is not None and name in postgres.UNAVAILABLE:
            missing(postgres.UNAVAILABLE[name])


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from tests.servers import postgres

    postgres.stop_all()


@pytest.fixture(scope="session")
def postgres_server(django_db_setup: None) -> Any:
    """The session's PostgreSQL cluster (alias ``postgres``), its test database created."""
    from tests.servers import postgres

    return postgres.SERVERS[postgres.POSTGRES_ALIAS]


@pytest.fixture(scope="session")
def pgbouncer_server(django_db_setup: None) -> Iterator[Any]:
    """PgBouncer in transaction mode (alias ``pgbouncer``, a test mirror of ``postgres``);
    stopped before the test database is dropped, which its server connections would block."""
    from tests.servers import postgres

    yield postgres.SERVERS[postgres.PGBOUNCER_ALIAS]
    postgres.stop_pgbouncer()


# A real browser for the admin: Debian's Chromium (scripts/install-servers installs it), driven
# by Playwright's Python API. Playwright's own browser downloads are never used.
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def chromium(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A Playwright browser context of Debian's Chromium, with a fresh profile in a temporary
    directory; missing Chromium or Playwright skips locally and fails under CI=true."""
    import os
    import tempfile

    from tests.servers import missing

    if not os.access(CHROMIUM, os.X_OK):
        missing(f"{CHROMIUM} is missing (scripts/install-servers installs Debian's chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("playwright is not installed (pip install -r requirements-dev.txt)")
    # Playwright's sync API runs an event loop in this thread, which makes Django refuse the
    # test's own ORM calls; the live server answers in a thread of its own.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with (
        tempfile.TemporaryDirectory(prefix="django_locks-chromium-") as profile,
        sync_playwright() as playwright,
    ):
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1440, "height": 900},
        )
        context.set_default_timeout(15_000)
        yield context
        context.close()
