"""RedisStore.check(): persistence and eviction warnings against real servers."""

from __future__ import annotations

import pytest

from django_locks.stores.redis import RedisStore

pytestmark = pytest.mark.redis


def _ids(messages: list[object]) -> list[str]:
    return sorted(message.id for message in messages)  # type: ignore[attr-defined]


def test_silent_on_a_durable_server(make_redis_server):
    store = RedisStore(url=make_redis_server().url)
    assert store.check(deploy=True) == []
    assert store.check(databases=["default"]) == []


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"appendonly": "no", "save": ""}, ["django_locks.W201"]),
        ({"appendonly": "no", "save": "900 1"}, ["django_locks.W202"]),
        ({"appendfsync": "everysec"}, ["django_locks.W203"]),
        ({"appendfsync": "no"}, ["django_locks.W203"]),
        ({"maxmemory-policy": "allkeys-lru"}, ["django_locks.W204"]),
        ({"maxmemory-policy": "volatile-ttl"}, ["django_locks.W204"]),
        (
            {"appendonly": "no", "save": "", "maxmemory-policy": "volatile-lru"},
            ["django_locks.W201", "django_locks.W204"],
        ),
    ],
)
def test_warns_on_a_misconfigured_server(make_redis_server, config, expected):
    store = RedisStore(url=make_redis_server(config).url)
    messages = store.check(deploy=True)
    assert _ids(messages) == expected
    for message in messages:
        assert message.hint and "Redis at 127.0.0.1" in message.msg


def test_no_io_without_deploy_or_databases(make_redis_server):
    server = make_redis_server({"appendonly": "no", "save": ""})
    store = RedisStore(url=server.url)
    assert store.check() == []
    assert store._process.peek() is None  # not even a connection was opened


def test_says_plainly_when_config_is_denied(make_redis_server):
    # Managed services rename or forbid CONFIG; the check cannot tell, and says so.
    server = make_redis_server(extra=("--rename-command", "CONFIG", ""))
    [message] = RedisStore(url=server.url).check(deploy=True)
    assert message.id == "django_locks.W205"
    assert "refuses CONFIG GET" in message.msg
    assert "appendonly yes" in message.hint and "noeviction" in message.hint


def test_warns_when_the_server_cannot_be_reached():
    store = RedisStore(url="redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
    [message] = store.check(deploy=True)
    assert message.id == "django_locks.W206"
    assert "could not reach Redis" in message.msg
