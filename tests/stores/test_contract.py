"""The store contract on every store we ship: InMemoryStore, DatabaseStore on SQLite and PostgreSQL
(also through PgBouncer), RedisStore on one server and on a Redis Cluster, EtcdStore on a
three-member etcd cluster.

Every ``LockStoreContract`` subclass of the test suite is here (tests/test_test_layout.py fails
on one elsewhere), so "every store we ship passes the contract" is this one file. A store's own
behaviour is in its module beside this one (tests/README.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from django_locks.stores import InMemoryStore
from django_locks.stores.database import DatabaseStore
from django_locks.testing import LockStoreContract

if TYPE_CHECKING:
    from django_locks.stores.etcd import EtcdStore
    from django_locks.stores.redis import RedisStore

# InMemoryStore.


class InMemoryStoreContract(LockStoreContract):
    concurrent_callers = 16

    def make_store(self) -> InMemoryStore:
        return InMemoryStore()


# DatabaseStore.


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


# RedisStore, imported in make_store(): this module is collected where redis-py is not installed
# (tests/conftest.py). The server's URL is set on the class: make_store() has no fixture arguments.


@pytest.fixture(scope="class")
def _redis_on_class(request, redis_server):
    request.cls.redis_url = redis_server.url


@pytest.mark.redis
@pytest.mark.usefixtures("_redis_on_class")
class RedisStoreContract(LockStoreContract):
    """The contract on 8 connections with 32 racing callers."""

    concurrent_callers = 32
    redis_url: str

    def make_store(self) -> RedisStore:
        from django_locks.stores.redis import RedisStore

        return RedisStore(url=self.redis_url, max_connections=8)


@pytest.fixture(scope="class")
def _cluster_on_class(request, redis_cluster):
    request.cls.cluster_url = redis_cluster.url


@pytest.mark.redis
@pytest.mark.usefixtures("_cluster_on_class")
class RedisClusterStoreContract(LockStoreContract):
    """The contract on a 3-master cluster, 8 connections per node, 32 racing callers."""

    concurrent_callers = 32
    cluster_url: str

    def make_store(self) -> RedisStore:
        from django_locks.stores.redis import RedisStore

        return RedisStore(url=self.cluster_url, cluster=True, max_connections=8)


# EtcdStore, on the suite's three-member cluster (tests/servers/etcd.py).


@pytest.fixture(scope="class")
def _etcd_on_class(request, etcd_cluster):
    request.cls.etcd_endpoints = etcd_cluster.endpoints


@pytest.mark.etcd
@pytest.mark.usefixtures("_etcd_on_class")
class EtcdStoreContract(LockStoreContract):
    """The contract on every member's endpoint, 16 racing callers. etcd keeps ttls in whole
    seconds and grants no lease below the cluster's minimum (2 s with the suite's
    --election-timeout 1000), so short leases are 2 s ones."""

    concurrent_callers = 16
    short_ttl_ms = 2000
    ttl_granularity_ms = 1000
    etcd_endpoints: list[str]

    def make_store(self) -> EtcdStore:
        from django_locks.stores.etcd import EtcdStore

        return EtcdStore(endpoints=self.etcd_endpoints)
