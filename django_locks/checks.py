"""System checks, ids ``django_locks.E0xx`` / ``W0xx`` (stores add their own from 100 on)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.apps import AppConfig
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from django_locks import conf


def register() -> None:
    checks.register(check_settings, "django_locks")
    checks.register(check_store, "django_locks")
    # Django passes every alias as `databases` to every check when none was asked for: only a
    # check tagged "database" runs just when one was (check --database, migrate, the test
    # runner), so the store's I/O waits for that tag or --deploy.
    checks.register(check_store_databases, "django_locks", checks.Tags.database)
    checks.register(check_production, "django_locks", deploy=True)
    checks.register(check_store_deploy, "django_locks", deploy=True)


# The I/O findings check_store_databases reported, and the `databases` object of that run,
# which check_store_deploy then does not repeat under `check --deploy --database`. Django runs
# the registered checks in no set order, the deployment checks after them, and hands one
# `databases` object to every check of a run: that object, not the order, tells the run.
_said: list[checks.CheckMessage] = []
_said_in: list[object] = []


def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """E001: ``LOCKS`` is not valid (or the store's own ids for options it refuses)."""
    try:
        config = conf.read()
        messages = config.backend.check_options(config.options)
        if messages:
            return list(messages)
        conf.build_store(config)
    except ImproperlyConfigured as exc:
        return [
            checks.Error(
                f"The LOCKS setting is not valid: {exc}",
                hint="Fix LOCKS as the message says; see the django_locks settings reference.",
                id="django_locks.E001",
            )
        ]
    return []


def check_production(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """E002 (``check --deploy``): the in-memory store would protect one process only."""
    # A deploy check looks at the store whatever DEBUG says: DEBUG = False alone is refused at
    # startup already, and a deploy run with DEBUG still on is what this check is for.
    try:
        config = conf.read()
    except ImproperlyConfigured:
        return []  # reported by E001
    if not config.in_memory or config.allow_in_memory_storage:
        return []
    return [
        checks.Error(
            "LOCKS['BACKEND'] is the InMemoryStore, which only protects one process: every "
            "instance of the deployed project would run the jobs meant to run once.",
            hint="Use 'django_locks.stores.DatabaseStore', 'django_locks.stores.RedisStore' or "
            "'django_locks.stores.EtcdStore' in the production settings (the in-memory store "
            "is for development and tests), or set "
            "LOCKS['ALLOW_IN_MEMORY_STORAGE'] = True if one process is really all you run.",
            id="django_locks.E002",
        )
    ]


def check_store(
    app_configs: Sequence[AppConfig] | None = None,
    **kwargs: Any,
) -> list[checks.CheckMessage]:
    """The configured store's own checks that need no I/O (run by every ``check``)."""
    return _store_messages(databases=None, deploy=False)


def check_store_databases(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Iterable[str] | None = None,
    **kwargs: Any,
) -> list[checks.CheckMessage]:
    """The store's checks that need I/O, for the ``databases`` Django names: run only when
    some are (``check --database``, ``migrate``, the test runner's databases)."""
    if not databases:
        return []
    without_io = _store_messages(databases=None, deploy=False)
    found = [m for m in _store_messages(databases=databases, deploy=False) if m not in without_io]
    _said[:] = found
    _said_in[:] = [databases]
    return found


def check_store_deploy(
    app_configs: Sequence[AppConfig] | None = None,
    **kwargs: Any,
) -> list[checks.CheckMessage]:
    """The configured store's deployment checks (``check --deploy``), which may do I/O; each
    finding said once, whether ``--database`` was given too or not."""
    databases = kwargs.get("databases")
    said = _store_messages(databases=None, deploy=False)
    if databases is not None and _said_in and _said_in[0] is databases:
        said += _said
    return [m for m in _store_messages(databases=None, deploy=True) if m not in said]


def _store_messages(*, databases: Iterable[str] | None, deploy: bool) -> list[checks.CheckMessage]:
    try:
        store = conf.build_store(conf.read())
    except ImproperlyConfigured:
        return []  # reported by E001
    try:
        return list(store.check(databases=databases, deploy=deploy))
    finally:
        store.close()
