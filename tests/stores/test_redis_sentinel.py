"""``RedisStore(sentinels=..., service_name=...)`` on a real master, replica and three Sentinels:
the store follows the master Sentinel promotes, keeps the replicated leases and tokens, and
refuses bad options without I/O."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from hypothesis import given, settings
from hypothesis import strategies as st

from django_locks.exceptions import StoreError
from django_locks.holders import Holder
from django_locks.owners import new_owner
from django_locks.stores.redis import RedisStore
from tests.servers.redis_sentinel import SERVICE, SentinelServers

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture
def servers() -> Iterator[SentinelServers]:
    started = SentinelServers()
    yield started
    started.destroy()


def holder() -> Holder:
    return Holder.parse("test:1")


def lease_keys(server: Any) -> list[bytes]:
    with server.client() as client:
        return list(client.keys("django_locks:*:lease"))


def test_the_store_follows_the_master_sentinel_promotes(servers: SentinelServers) -> None:
    store = RedisStore(sentinels=servers.addresses, service_name=SERVICE, socket_timeout=5)
    assert str(store).startswith(f"Redis Sentinel {SERVICE!r} (127.0.0.1:")
    key, owner = f"sentinel:{new_owner()}", new_owner()
    token = store.acquire_as(key, owner, 60_000, holder())
    assert type(token) is int
    assert lease_keys(servers.master)
    with servers.master.client() as client:
        assert client.execute_command("WAIT", 1, 5000) == 1  # on the replica before the kill
    new = servers.failover()
    # The pooled connection to the dead master fails; the renewal is sent again on a fresh
    # one, which asks the Sentinels where the master is now.
    assert store.renew(key, owner, 60_000) is True
    other = f"sentinel:{new_owner()}"
    later = store.acquire_as(other, new_owner(), 60_000, holder())
    assert type(later) is int and later > token  # the fencing counter came along
    assert len(lease_keys(new)) == 2
    assert isinstance(store.acquire_as(key, new_owner(), 60_000, holder()), Holder)
    assert store.release(key, owner)


def test_no_sentinel_answering_is_a_store_error_naming_the_service(
    servers: SentinelServers,
) -> None:
    store = RedisStore(sentinels=servers.addresses, service_name="nosuchmaster")
    with pytest.raises(StoreError, match="No master found for 'nosuchmaster'"):
        store.acquire(f"sentinel:{new_owner()}", new_owner(), 5_000, timeout=3)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"sentinels": ["127.0.0.1:26379"]}, "'sentinels' and 'service_name' go together"),
        ({"service_name": "mymaster"}, "'sentinels' and 'service_name' go together"),
        ({"sentinels": [], "service_name": "m"}, "must be a non-empty list"),
        ({"sentinels": "127.0.0.1:26379", "service_name": "m"}, "must be a non-empty list"),
        ({"sentinels": ["127.0.0.1"], "service_name": "m"}, "'host:port' strings"),
        ({"sentinels": ["127.0.0.1:0"], "service_name": "m"}, "'host:port' strings"),
        ({"sentinels": ["127.0.0.1:x"], "service_name": "m"}, "'host:port' strings"),
        ({"sentinels": [("127.0.0.1", True)], "service_name": "m"}, "'host:port' strings"),
        ({"sentinels": ["127.0.0.1:26379"], "service_name": ""}, "'service_name' must be"),
        (
            {"sentinels": ["127.0.0.1:26379"], "service_name": "m", "cluster": True},
            "not available with cluster=True",
        ),
    ],
)
def test_bad_sentinel_options_are_refused_without_io(options: dict[str, Any], says: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=says):
        RedisStore(**options)


def test_sentinels_accept_pairs_and_take_credentials_from_the_url() -> None:
    store = RedisStore(
        url="redis://:secret@localhost/3",
        sentinels=[("127.0.0.1", 26379), "127.0.0.1:26380"],
        service_name="m",
    )
    assert store.sentinels == [("127.0.0.1", 26379), ("127.0.0.1", 26380)]
    kwargs = store._options.connection_kwargs
    assert kwargs["password"] == "secret" and kwargs["db"] == 3 and "host" not in kwargs
    assert "secret" not in repr(store) and "secret" not in str(store)


def test_a_rediss_url_keeps_tls_to_the_master() -> None:
    from redis.sentinel import SentinelManagedConnection, SentinelManagedSSLConnection

    plain = RedisStore(sentinels=["127.0.0.1:26379"], service_name="m")
    assert plain._options.connection_class is SentinelManagedConnection
    secure = RedisStore(url="rediss://:pw@/0", sentinels=["127.0.0.1:26379"], service_name="m")
    assert secure._options.connection_class is SentinelManagedSSLConnection


_ANYTHING = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner),
    max_leaves=8,
)


@given(sentinels=_ANYTHING, service_name=_ANYTHING)
@settings(max_examples=300, deadline=None)
def test_any_sentinel_options_build_a_store_or_are_refused_by_name(
    sentinels: Any, service_name: Any
) -> None:
    try:
        store = RedisStore(sentinels=sentinels, service_name=service_name)
    except ImproperlyConfigured as exc:
        assert "'sentinels'" in str(exc) or "'service_name'" in str(exc)
    else:
        assert store.sentinels and all(0 < port < 65536 for _, port in store.sentinels)
        assert isinstance(store.service_name, str) and store.service_name
