"""The database store lets go of a test database before Django creates or destroys it.

``DatabaseStore`` keeps connections of its own (and, on PostgreSQL, a ``LISTEN`` session). Left
open, they make PostgreSQL refuse ``DROP DATABASE`` at the end of ``manage.py test`` or a
pytest-django session (``database "test_mysite" is being accessed by other users``): the run
exits 1 and the next one finds the test database still there.

The hook: ``BaseDatabaseCreation.destroy_test_db`` (and ``create_test_db``) are wrapped once,
when the first ``DatabaseStore`` is made, so that every live store closes its connections to
that database first. Both methods are what Django's test runner (``teardown_databases``) and
pytest-django call for every test database, on every backend (no backend of Django's overrides
them; they override ``_destroy_test_db``), so no custom runner is needed. The alternatives are
worse: ``teardown_databases`` is imported by name into the runner and into pytest-django (a
patch of ``django.test.utils`` would not be seen), the private ``_destroy_test_db`` is
overridden per backend, and Django sends no signal when it destroys a test database. A backend
of a third party that overrides ``destroy_test_db`` without calling ``super()`` bypasses the
hook; ``reset_locks()`` and ``DatabaseStore.close()`` remain for it.

Before ``create_test_db`` the stores close too: a store used before the test databases were set
up would otherwise keep its connections to the development database during the tests.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.backends.base.creation import BaseDatabaseCreation

from django_locks.exceptions import StoreError

if TYPE_CHECKING:
    from django_locks.stores.database import DatabaseStore

_STORES: weakref.WeakSet[DatabaseStore] = weakref.WeakSet()
_INSTALL_LOCK = threading.Lock()
_MARK = "_django_locks_wrapped"


def track(store: DatabaseStore) -> None:
    """Remember ``store`` (weakly) and make sure the hook is installed."""
    install()
    _STORES.add(store)


def install() -> None:
    """Wrap ``create_test_db``, ``clone_test_db`` and ``destroy_test_db`` of
    ``BaseDatabaseCreation``, once."""
    with _INSTALL_LOCK:
        for name in ("create_test_db", "clone_test_db", "destroy_test_db"):
            method = getattr(BaseDatabaseCreation, name)
            if not getattr(method, _MARK, False):
                setattr(BaseDatabaseCreation, name, _wrap(method, name))


def _wrap(method: Callable[..., Any], name: str) -> Callable[..., Any]:
    signature = inspect.signature(method)

    @functools.wraps(method)
    def wrapper(self: BaseDatabaseCreation, *args: Any, **kwargs: Any) -> Any:
        # Keyword names as Django's own signature has them (5.2 to 6.1: keepdb, suffix).
        arguments = signature.bind(self, *args, **kwargs).arguments
        suffix = arguments.get("suffix")
        if suffix is None or name == "clone_test_db":
            # A clone (the parallel runner's) is made from the test database as a template,
            # which PostgreSQL refuses while anybody is connected to it.
            database = self.connection.settings_dict["NAME"]
        else:  # a clone of the parallel runner: only its workers' stores used it
            database = self.get_test_db_clone_settings(suffix)["NAME"]
        destroying = name == "destroy_test_db"
        let_go(
            self.connection.alias,
            database,
            clear=destroying and bool(arguments.get("keepdb")) and suffix is None,
            forget=destroying,
        )
        return method(self, *args, **kwargs)

    setattr(wrapper, _MARK, True)
    return wrapper


def let_go(
    alias: str, database: str | None = None, *, clear: bool = False, forget: bool = False
) -> None:
    """Close the connections of every store that reaches ``alias`` (or the database named
    ``database``, as a test mirror does).

    ``forget`` also forgets the locks this process still holds on those stores (their
    renewals would reconnect to a database about to be dropped); ``clear`` frees the stores'
    leases first, so that a test database kept for the next run (``--keepdb``) starts with no
    lease of this one."""
    from django_locks.renewal import held_keepers

    for store in _stores_reaching(alias, database):
        if forget:
            for keeper in held_keepers():
                if keeper.store is store:
                    keeper.detach(f"the test database of {alias!r} was torn down")
        if clear:
            with contextlib.suppress(StoreError):
                store.clear()
        store.close()


def _stores_reaching(alias: str, database: str | None) -> list[DatabaseStore]:
    found = []
    for store in list(_STORES):
        for used in (store.using, store.listen_using):
            if used is None:
                continue
            if used == alias or (
                database is not None
                and used in connections.settings
                and connections.settings[used].get("NAME") == database
            ):
                found.append(store)
                break
    return found
