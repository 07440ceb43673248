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
    checks.register(check_production, "django_locks", deploy=True)
    checks.register(check_store_deploy, "django_locks", deploy=True)


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
            hint="Use 'django_locks.stores.DatabaseStore' or 'django_locks.stores.RedisStore' in "
            "the production settings (the in-memory store is for development and tests), or set "
            "LOCKS['ALLOW_IN_MEMORY_STORAGE'] = True if one process is really all you run.",
            id="django_locks.E002",
        )
    ]


def check_store(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Iterable[str] | None = None,
    **kwargs: Any,
) -> list[checks.CheckMessage]:
    """The configured store's own checks: without I/O always, the I/O ones only for the
    ``databases`` Django names (``check --database``, the test runner's databases)."""
    return _store_messages(databases=databases, deploy=False)


def check_store_deploy(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Iterable[str] | None = None,
    **kwargs: Any,
) -> list[checks.CheckMessage]:
    """The configured store's deployment checks (``check --deploy``), which may do I/O.

    Under ``check --deploy --database ...`` the database-tagged check reports the same I/O
    findings already: say them once."""
    if databases:
        return []
    # check_store reports the store's checks without I/O already (W101, say): say them once.
    said = _store_messages(databases=None, deploy=False)
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
