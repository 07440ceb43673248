"""DatabaseStore: the store contract on PostgreSQL (also through PgBouncer) and SQLite."""

from __future__ import annotations

import pytest

from django_locks.stores.database import DatabaseStore
from django_locks.testing import LockStoreContract


class SQLiteContract(LockStoreContract):
    """SQLite's in-memory test database, through Django's own connection."""

    concurrent_callers = 32

    def make_store(self) -> DatabaseStore:
        return DatabaseStore("default")


@pytest.mark.postgres
class PostgresPooledContract(LockStoreContract):
    """32 racing callers sharing a pool of 20 connections."""

    concurrent_callers = 32

    def make_store(self) -> DatabaseStore:
        return DatabaseStore("postgres", max_connections=20)


@pytest.mark.postgres
class PostgresPerThreadContract(LockStoreContract):
    """One connection per calling thread (the default)."""

    concurrent_callers = 32
    rounds = 2

    def make_store(self) -> DatabaseStore:
        return DatabaseStore("postgres")


@pytest.mark.pgbouncer
@pytest.mark.usefixtures("pgbouncer_server")
class PgBouncerTransactionModeContract(LockStoreContract):
    """Through PgBouncer in transaction pooling mode (20 server connections, 32 callers)."""

    concurrent_callers = 32

    def make_store(self) -> DatabaseStore:
        # LISTEN needs a session: notices go out through PgBouncer, waiters listen directly.
        return DatabaseStore("pgbouncer", listen_using="postgres")
