"""RedisStore against a real redis-server: configuration, key layout, scripts, timeouts, fork (the
contract is in test_contract.py)."""

from __future__ import annotations

import datetime
import multiprocessing
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import redis.exceptions
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from redis.crc import key_slot

from django_locks.exceptions import StoreError, StoreTimeoutError
from django_locks.holders import Holder
from django_locks.stores.base import LeaveReason
from django_locks.stores.redis import RedisStore, scripts
from django_locks.stores.redis.scripts import pack
from tests.waiting import eventually

T = TypeVar("T")
ONE_SECOND = datetime.timedelta(seconds=1)
WORKER = Holder(host="web-2", pid=4121, kind="worker", detail="9f1c2b7e-task-id")


def _owner() -> str:
    return uuid.uuid4().hex


# Configuration: validated in the constructor, without I/O.


def test_exactly_one_of_url_and_cache():
    with pytest.raises(ImproperlyConfigured, match="exactly one of the options 'url'"):
        RedisStore()
    with pytest.raises(ImproperlyConfigured, match="exactly one"):
        RedisStore(url="redis://localhost", cache="default")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"prefix": "a{b}"}, "'prefix' must be a non-empty string without braces"),
        ({"prefix": ""}, "'prefix'"),
        ({"max_connections": 0}, "'max_connections' must be at least 1"),
        ({"max_connections": "8"}, "'max_connections' must be an int"),
        ({"socket_timeout": "5x"}, "socket_timeout"),
        ({"socket_connect_timeout": -1}, "socket_connect_timeout"),
        ({"cluster": "yes"}, "'cluster' must be a bool"),
        ({"url": "http://localhost"}, "'url' is not a Redis URL"),
    ],
)
def test_bad_options_are_refused_naming_the_option(options, message):
    kwargs = {"url": "redis://127.0.0.1:1/0", **options}
    with pytest.raises(ImproperlyConfigured, match=message):
        RedisStore(**kwargs)


def test_construction_does_no_io():
    # Nothing listens on port 1: building the store (and its no-I/O checks) must not notice.
    store = RedisStore(url="redis://127.0.0.1:1/0", socket_timeout="500ms")
    assert store.check() == []
    assert store.socket_timeout == 0.5
    assert "127.0.0.1:1" in repr(store)


def test_durations_are_accepted_for_timeouts():
    store = RedisStore(url="redis://h/0", socket_timeout="1.5s", socket_connect_timeout=0.25)
    assert (store.socket_timeout, store.socket_connect_timeout) == (1.5, 0.25)


def test_password_is_not_shown_in_repr():
    store = RedisStore(url="redis://user:s3cret@redis.example:6379/2")
    assert "s3cret" not in repr(store)


def test_cache_alias_of_djangos_redis_cache():
    caches = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "redis": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": ["redis://primary:6379/3", "redis://replica:6379/3"],
            "OPTIONS": {"password": "pw", "socket_timeout": 99, "socket_connect_timeout": 99},
        },
    }
    with override_settings(CACHES=caches):
        store = RedisStore(cache="redis", socket_timeout=2)
    assert store.url == "redis://primary:6379/3"
    kwargs = store._connection_kwargs
    assert (kwargs["host"], kwargs["db"], kwargs["password"]) == ("primary", 3, "pw")
    # The store's own timeouts, never the cache's (a cache may wait forever): a call's deadline
    # (socket_timeout by default) is kept by the watchdog, not by the socket, and each
    # connection gets the store's connect timeout when it is made.
    assert (store.socket_timeout, store.socket_connect_timeout) == (2, 2)
    assert kwargs["socket_timeout"] is None
    assert "socket_connect_timeout" not in kwargs


def test_cache_alias_of_django_redis():
    caches = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://cachehost:6380/1",
            "OPTIONS": {"PASSWORD": "pw", "CONNECTION_POOL_KWARGS": {"max_connections": 3}},
        }
    }
    with override_settings(CACHES=caches):
        store = RedisStore(cache="default", max_connections=8)
    kwargs = store._connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["password"]) == ("cachehost", 6380, "pw")
    assert "max_connections" not in kwargs
    assert store.max_connections == 8


def test_cache_alias_must_exist_and_be_a_redis_cache():
    caches = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    with override_settings(CACHES=caches):
        with pytest.raises(ImproperlyConfigured, match="'nope', which is not in CACHES"):
            RedisStore(cache="nope")
        with pytest.raises(ImproperlyConfigured, match="is not a Redis cache"):
            RedisStore(cache="default")


# Key layout.


@pytest.mark.parametrize("key", ["plain", "{tag}", "a{b}c", "}{", "{}", "é" * 500, "x:{y}:lease"])
def test_lease_and_counter_share_one_slot_whatever_the_key(key):
    lease, fence = RedisStore(url="redis://h/0")._keys(key)
    assert key_slot(lease) == key_slot(fence)
    assert lease.startswith(b"django_locks:{") and lease.endswith(b"}:lease")


def test_keys_with_the_same_braces_land_in_different_slots():
    store = RedisStore(url="redis://h/0")
    slots = {key_slot(store._keys(f"{{same}}:{i}")[0]) for i in range(50)}
    assert len(slots) > 40  # a user's hash tag does not pin every key to one slot


@pytest.mark.redis
def test_prefixes_keep_projects_apart(redis_server):
    one = RedisStore(url=redis_server.url, prefix=f"one{uuid.uuid4().hex[:6]}")
    two = RedisStore(url=redis_server.url, prefix=f"two{uuid.uuid4().hex[:6]}")
    key = "shared:name"
    assert one.acquire(key, _owner(), 30_000) is not None
    assert two.acquire(key, _owner(), 30_000) is not None
    assert [lease.key for lease in one.leases()] == [key]
    two.clear()
    assert [lease.key for lease in one.leases()] == [key]
    assert two.leases() == []
    one.clear()


@pytest.mark.redis
def test_counter_never_expires_and_release_keeps_it(redis_server):
    store = RedisStore(url=redis_server.url, prefix=f"t{uuid.uuid4().hex[:8]}")
    owner = _owner()
    token = store.acquire("k", owner, 60_000)
    lease, fence = store._keys("k")
    with redis_server.client() as client:
        assert 0 < client.pttl(lease) <= 60_000
        assert client.pttl(fence) == -1
        assert int(client.get(fence)) == token
        store.release("k", owner)
        assert not client.exists(lease)
        assert int(client.get(fence)) == token


@pytest.mark.redis
def test_the_time_floor_wins_over_a_lost_counter(redis_server):
    store = RedisStore(url=redis_server.url, prefix=f"t{uuid.uuid4().hex[:8]}")
    owner = _owner()
    first = store.acquire("k", owner, 60_000)
    store.release("k", owner)
    _, fence = store._keys("k")
    with redis_server.client() as client:
        client.delete(fence)  # what an eviction or a crash before the write reached disk does
        seconds, micros = client.time()
    second = store.acquire("k", _owner(), 60_000)
    assert first is not None and second is not None
    assert second > first
    assert second >= seconds * 1_000_000 + micros


@pytest.mark.redis
def test_tokens_run_ahead_of_the_clock_by_the_counter(redis_server):
    store = RedisStore(url=redis_server.url, prefix=f"t{uuid.uuid4().hex[:8]}")
    _, fence = store._keys("k")
    future = 2**52  # far beyond TIME in microseconds: the counter is the floor
    with redis_server.client() as client:
        client.set(fence, future)
    assert store.acquire("k", _owner(), 60_000) == future + 1


@pytest.mark.redis
def test_a_token_lua_cannot_represent_is_refused_not_rounded(redis_server):
    store = RedisStore(url=redis_server.url, prefix=f"t{uuid.uuid4().hex[:8]}")
    _, fence = store._keys("k")
    with redis_server.client() as client:
        client.set(fence, 2**53 - 1)
    with pytest.raises(StoreError, match="beyond 2\\^53"):
        store.acquire("k", _owner(), 60_000)


# Scripts by SHA, recovering from NOSCRIPT.


@pytest.mark.redis
def test_script_flush_mid_run_costs_no_failed_operation(redis_server):
    store = RedisStore(url=redis_server.url, prefix=f"t{uuid.uuid4().hex[:8]}", max_connections=4)
    errors: list[BaseException] = []
    done = {"ops": 0}
    stop = threading.Event()

    def work(worker: int) -> None:
        key, owner = f"k{worker}", _owner()
        previous = 0
        try:
            while not stop.is_set():
                token = store.acquire(key, owner, 30_000)
                assert token is not None and token > previous
                previous = token
                assert store.renew(key, owner, 30_000)
                assert store.release(key, owner)
                done["ops"] += 3
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    flushes = 0
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and not errors:
        time.sleep(0.05)
        redis_server.script_flush()
        flushes += 1
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert flushes >= 20 and done["ops"] > 300, (flushes, done)
    with redis_server.client() as client:
        assert client.ping()  # the server is still up after the flushes


# Connections: bounded, timeouts, errors, fork.


@pytest.mark.redis
def test_a_store_opens_at_most_max_connections(redis_server):
    store = RedisStore(url=redis_server.url, max_connections=3, prefix=f"t{uuid.uuid4().hex[:8]}")
    threads = [
        threading.Thread(
            target=lambda i=i: [store.acquire(f"k{i}", "o", 30_000) for _ in range(20)]
        )
        for i in range(12)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    pools = store._process.get().pools
    assert list(pools) == [("ops", None)]
    assert pools["ops", None].idle() <= 3
    store.close()


@pytest.mark.redis
def test_unreachable_server_raises_store_error_never_none():
    store = RedisStore(url="redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
    with pytest.raises(StoreError) as info:
        store.acquire("k", _owner(), 1000)
    assert info.value.__cause__ is not None
    with pytest.raises(StoreError):
        store.renew("k", _owner(), 1000)
    with pytest.raises(StoreError):
        store.release("k", _owner())


@pytest.mark.redis
def test_a_hanging_server_times_out_within_the_call_timeout(make_redis_server):
    server = make_redis_server()
    store = RedisStore(url=server.url, socket_timeout=30)
    owner = _owner()
    token = store.acquire("k", owner, 60_000)
    os.kill(server.process.pid, signal.SIGSTOP)  # a paused server: TCP accepts, nobody answers
    try:
        started = time.monotonic()
        with pytest.raises(StoreTimeoutError):
            store.renew("k", owner, 60_000, timeout=0.3)
        elapsed = time.monotonic() - started
        assert elapsed < 1.0, elapsed
        started = time.monotonic()
        with pytest.raises(StoreTimeoutError):
            store.acquire("other", owner, 60_000, timeout=0.2)  # a new connection times out too
        assert time.monotonic() - started < 1.0
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    # The timed-out connection was discarded: the next call gets a clean answer, not a stale one.
    assert store.acquire("k", owner, 60_000, timeout=5) == token
    assert store.release("k", owner)


@pytest.mark.redis
def test_a_timeout_already_passed_sends_nothing(redis_server):
    store = RedisStore(url=redis_server.url, prefix=f"t{uuid.uuid4().hex[:8]}")
    with pytest.raises(StoreTimeoutError):
        store.acquire("k", _owner(), 1000, timeout=0)
    assert store.leases() == []


def _child_uses_store(
    store: RedisStore, key: str, queue: multiprocessing.Queue[tuple[str, object, object]]
) -> None:
    try:
        owner = _owner()
        token = store.acquire(key, owner, 30_000)
        queue.put(("ok", token, store.release(key, owner)))
        store.close()  # closes only the child's connections
    except BaseException as exc:
        queue.put(("error", repr(exc), None))


@pytest.mark.redis
def test_safe_across_fork(redis_server):
    store = RedisStore(url=redis_server.url, prefix=f"t{uuid.uuid4().hex[:8]}")
    owner = _owner()
    parent_token = store.acquire("parent", owner, 30_000)  # the parent has a live connection
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_uses_store, args=(store, "child", queue))
    child.start()
    status, token, released = queue.get(timeout=30)
    child.join(timeout=30)
    assert (status, released) == ("ok", True), token
    # The parent's connection survived the child's use and close().
    assert store.renew("parent", owner, 30_000)
    assert store.acquire("parent", owner, 30_000) == parent_token
    store.clear()


# The ACL the deployment guide documents (docs/howto/redis-deployment.rst) is enough.
DOCUMENTED_ACL = (
    "on >locks-secret ~acltest:* resetchannels -@all +evalsha +script|load +scan "
    "+del +hget +hmget +hset +pexpire +pttl +get +set +time +rpush +blpop +ping +hello "
    "+config|get +wait +info"
)


@pytest.mark.redis
def test_the_documented_acl_is_enough(redis_server):
    with redis_server.client() as client:
        client.execute_command("ACL", "SETUSER", "locks", *DOCUMENTED_ACL.split())
    url = f"redis://locks:locks-secret@127.0.0.1:{redis_server.port}/0"
    store = RedisStore(url=url, prefix="acltest")
    redis_server.script_flush()  # the first call must load its script itself
    owner = _owner()
    token = store.acquire("acl", owner, 30_000)
    assert token is not None
    assert store.renew("acl", owner, 30_000)
    assert [lease.key for lease in store.leases()] == ["acl"]
    assert store.release("acl", owner)
    # The scripts of 0.2.0 (the holder described, the renewal recorded) need no other command.
    assert isinstance(store.acquire_as("acl", owner, 30_000, WORKER), int)
    assert isinstance(store.acquire_as("acl", _owner(), 30_000, WORKER), Holder)
    assert store.renew_many([("acl", owner, 30_000)]) == [True]
    assert store.leave("acl", owner, 30_000, "lapsed")
    listed = store.lease("acl")
    assert listed is not None and listed.last_renewed is not None
    assert store.end("acl", owner, "released")
    assert store.force_release("acl") is False
    assert store.check(deploy=True) == []
    store.clear()


@pytest.mark.redis
def test_blocked_waiters_never_hold_up_renewals(redis_server):
    store = RedisStore(url=redis_server.url, max_connections=2, prefix=f"t{uuid.uuid4().hex[:8]}")
    owner = _owner()
    assert store.acquire("k", owner, 30_000) is not None
    results: list[bool] = []
    waiters = [
        threading.Thread(target=lambda: results.append(store.wait_for_release("k", 1.0)))
        for _ in range(6)
    ]
    for waiter in waiters:
        waiter.start()
    time.sleep(0.2)  # the first two block in BLPOP, the others wait for a wait connection
    started = time.monotonic()
    assert store.renew("k", owner, 30_000, timeout=0.5)
    assert time.monotonic() - started < 0.5
    assert store.release("k", owner)
    for waiter in waiters:
        waiter.join(timeout=10)
    assert True in results  # one release wakes one waiter; the others time out with False
    assert len(results) == 6


@pytest.mark.redis
def test_a_release_hands_over_to_a_waiter_at_once(redis_server):
    store = RedisStore(url=redis_server.url, prefix=f"t{uuid.uuid4().hex[:8]}")
    owner = _owner()
    store.acquire("k", owner, 30_000)
    woken: list[float] = []

    def wait() -> None:
        assert store.wait_for_release("k", 5)
        woken.append(time.monotonic())

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.2)
    released = time.monotonic()
    store.release("k", owner)
    waiter.join(timeout=10)
    assert woken and woken[0] - released < 0.1, woken
    assert store.acquire("k", _owner(), 30_000) is not None


@pytest.mark.redis
def test_renew_many_survives_a_script_flush_with_one_script_call_per_lease(redis_server):
    store = RedisStore(url=redis_server.url, prefix=f"t{uuid.uuid4().hex[:8]}", max_connections=1)
    owner = _owner()
    for i in range(50):
        store.acquire(f"k{i}", owner, 60_000)
    redis_server.script_flush()
    with redis_server.client() as client:
        calls_before = client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    assert store.renew_many([(f"k{i}", owner, 60_000) for i in range(50)]) == [True] * 50
    with redis_server.client() as client:
        calls = client.info("commandstats")["cmdstat_evalsha"]["calls"] - calls_before
    assert calls == 50  # one script call per lease, all in the one pipeline, none failed


# The wire (redis-py's Connection, read by its own parser): however the bytes arrive, every reply
# is whole, and a connection out of step, cut short or silent never answers a later call.


class _ScriptedServer:
    """A TCP server that answers redis-py's handshake (CLIENT ...) with +OK and the next
    ``commands`` other commands with the chunks of the next ``answer()``, one send each;
    commands past the last answer get nothing."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self._answers: list[tuple[list[bytes], int]] = []
        self._skip = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def answer(self, *chunks: bytes, commands: int = 1) -> None:
        self._answers.append((list(chunks), commands))

    def store(self) -> RedisStore:
        return RedisStore(url=f"redis://127.0.0.1:{self.port}/0")

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buffer = b""
        with conn:
            while data := conn.recv(65536):
                buffer += data
                while (parsed := _command(buffer)) is not None:
                    args, buffer = parsed
                    if args[0].upper() == b"CLIENT":
                        conn.sendall(b"+OK\r\n")
                    elif self._skip:
                        self._skip -= 1  # answered already, in the chunks of its pipeline
                    elif self._answers:
                        chunks, commands = self._answers.pop(0)
                        self._skip = commands - 1
                        for chunk in chunks:
                            conn.sendall(chunk)
                            time.sleep(0.002)  # each chunk its own recv

    def close(self) -> None:
        self.listener.close()


def _command(buffer: bytes) -> tuple[list[bytes], bytes] | None:
    """The first whole RESP command in ``buffer`` and the rest, or None."""
    end = buffer.find(b"\r\n")
    if end < 0:
        return None
    position, args = end + 2, []
    for _ in range(int(buffer[1:end])):
        end = buffer.find(b"\r\n", position)
        if end < 0:
            return None
        start = end + 2
        size = int(buffer[position + 1 : end])
        if len(buffer) < start + size + 2:
            return None
        args.append(buffer[start : start + size])
        position = start + size + 2
    return args, buffer[position:]


@pytest.fixture
def scripted() -> Iterator[_ScriptedServer]:
    server = _ScriptedServer()
    yield server
    server.close()


def _pipeline(store: RedisStore, count: int, timeout: float = 5) -> list[object]:
    return store._pool(None).pipeline([pack("PING")] * count, time.monotonic() + timeout)


def test_replies_split_anywhere_are_read_whole(scripted):
    stream = b":42\r\n$-1\r\n$5\r\nhe\r\no\r\n*-1\r\n*2\r\n$3\r\nkey\r\n:-7\r\n+OK\r\n$0\r\n\r\n"
    expected = [42, None, b"he\r\no", None, [b"key", -7], b"OK", b""]
    scripted.answer(stream, commands=7)
    scripted.answer(*(bytes([byte]) for byte in stream), commands=7)
    store = scripted.store()
    assert _pipeline(store, 7) == expected
    assert _pipeline(store, 7) == expected
    assert scripted.connections == 1  # in step after each: the connection is reused


def test_error_replies_come_back_as_redis_py_exceptions(scripted):
    scripted.answer(
        b"-NOSCRIPT No matching script.\r\n",
        b"-MOVED 3999 127.0.0.1:6381\r\n-ERR nope\r\n",
        commands=3,
    )
    noscript, moved, other = _pipeline(scripted.store(), 3)
    assert isinstance(noscript, redis.exceptions.NoScriptError)
    assert isinstance(moved, redis.exceptions.MovedError)
    assert (moved.slot_id, moved.host, moved.port) == (3999, "127.0.0.1", 6381)
    # redis-py drops the generic "ERR " from the message.
    assert type(other) is redis.exceptions.ResponseError and str(other) == "nope"


def test_a_reply_out_of_step_never_answers_a_later_call(scripted):
    scripted.answer(b":1\r\n:2\r\n")  # two replies to one command
    scripted.answer(b":3\r\n")
    store = scripted.store()
    assert _pipeline(store, 1) == [1]
    assert _pipeline(store, 1) == [3]  # not the stray 2: a fresh connection
    assert scripted.connections == 2


@pytest.mark.parametrize(
    "stream",
    [b"%1\r\n", b"$x\r\n", b"$10\r\nhalf"],  # RESP3 (ours speak RESP2), garbage, cut short
)
def test_a_reply_garbled_or_cut_short_is_a_store_error(scripted, stream):
    scripted.answer(stream)
    store = scripted.store()
    with pytest.raises(StoreError) as caught:
        _pipeline(store, 1, timeout=0.5 if stream.startswith(b"$10") else 5)
    assert caught.value.__cause__ is not None
    assert store._pool(None).idle() == 0  # discarded


def test_a_reply_cut_short_by_a_close_is_a_store_error():
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            while (data := conn.recv(65536)) and b"PING" not in data:
                conn.sendall(b"+OK\r\n" * data.count(b"CLIENT"))
            conn.sendall(b"$10\r\nhalf")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with listener:
        store = RedisStore(url=f"redis://127.0.0.1:{listener.getsockname()[1]}/0")
        with pytest.raises(StoreError) as caught:
            _pipeline(store, 1)
        assert isinstance(caught.value.__cause__, redis.exceptions.ConnectionError)
        assert not isinstance(caught.value, StoreTimeoutError)
    thread.join(timeout=5)


def test_a_reply_that_never_comes_times_out_at_the_deadline(scripted):
    scripted.answer(b":1")  # the rest of the line never comes
    store = scripted.store()
    started = time.monotonic()
    with pytest.raises(StoreTimeoutError):
        _pipeline(store, 1, timeout=0.2)
    assert 0.15 < time.monotonic() - started < 1.0


@pytest.mark.redis
def test_a_url_asking_for_resp3_gets_resp2_connections(redis_server):
    store = RedisStore(url=f"{redis_server.url}?protocol=3", prefix=f"t{uuid.uuid4().hex[:8]}")
    owner = _owner()
    token = store.acquire("k", owner, 30_000)
    assert token is not None and store.renew("k", owner, 30_000)
    assert [lease.fencing_token for lease in store.leases()] == [token]
    with redis_server.client() as client:
        ours = [c for c in client.client_list() if c["cmd"] in ("evalsha", "scan")]
    assert ours and {c["resp"] for c in ours} == {"2"}
    assert store.release("k", owner) is True
    store.close()


@pytest.mark.redis
def test_a_pooled_connection_killed_meanwhile_fails_no_call(redis_server):
    # acquire and renew are sent again on a fresh connection (they are idempotent); release
    # checks its pooled connection before sending. Either way no call fails, none runs twice.
    store = RedisStore(url=redis_server.url, prefix=f"t{uuid.uuid4().hex[:8]}", max_connections=1)
    owner = _owner()

    def kill() -> None:
        with redis_server.client() as client:
            assert client.client_kill_filter(_type="normal", skipme=True) >= 1

    token = store.acquire("k", owner, 30_000)
    kill()
    assert store.acquire("k", owner, 30_000) == token
    kill()
    assert store.renew("k", owner, 30_000)
    kill()
    assert store.release("k", owner) is True
    kill()
    assert store.acquire("k", _owner(), 30_000) is not None
    store.clear()


def test_a_failed_script_load_leaves_no_reply_unread(scripted):
    """The script flushed, then its load refused (BUSY): both replies of the load-and-call are
    read before the error is raised, so the next call reads its own reply, not the stale one."""
    scripted.answer(b"-NOSCRIPT No matching script.\r\n")
    scripted.answer(
        b"-BUSY Redis is busy running a script.\r\n",
        b"-NOSCRIPT No matching script.\r\n",
        commands=2,
    )
    scripted.answer(b"$-1\r\n")  # the next acquire: refused, the key is held
    store = scripted.store()
    with pytest.raises(StoreError, match="BUSY"):
        store.acquire("a", "o1", 30_000)
    assert store.acquire("y", "o2", 30_000) is None
    assert scripted.connections == 1  # in step: the same connection served both


@pytest.mark.redis
def test_a_url_naming_its_own_connect_timeout_still_connects(redis_server):
    store = RedisStore(url=f"{redis_server.url}?socket_connect_timeout=1")
    try:
        token = store.acquire("url-timeout", "o1", 30_000)
        assert token is not None and store.release("url-timeout", "o1")
    finally:
        store.close()


# Holders (0.2.0): described in the lease's hash, next to the fields of 0.1.0's layout.

PREVIOUS_RELEASE_SHAS = {
    # sha1 of each script's body in 0.1.0 (e6af6cb:django_locks/stores/redis.py): a 0.1.0 process
    # calls these on the leases this release writes.
    "ACQUIRE": "75e4acf4bb1cee86f2b2e0696b4a1682823cbb52",
    "RENEW": "30f278f5af6369f205252950f2790fb56eb17346",
    "RELEASE": "1d66f844a717e7d3d5b97ca851de720ed8c5dcda",
    "FORCE_RELEASE": "afa74c9036083eab59f6c7926d80884a4be57705",
    "INSPECT": "3b0dba3742935e6070d46e1bf0d66184491a1beb",
}


def test_the_previous_release_scripts_are_kept_byte_for_byte():
    for name, sha in PREVIOUS_RELEASE_SHAS.items():
        assert getattr(scripts, name).sha.decode() == sha, name
    new = {scripts.ACQUIRE_AS.sha, scripts.RENEW_RECORDED.sha, scripts.DESCRIBE.sha}
    assert len(new) == 3 and not new & {sha.encode() for sha in PREVIOUS_RELEASE_SHAS.values()}


def _sent(server: Any, call: Callable[[], T]) -> tuple[T, list[str]]:
    """``call()``'s result and the commands clients sent the server meanwhile, as MONITOR lists
    them (the commands a script runs show as sent by "lua": not counted)."""
    marker = uuid.uuid4().hex
    with server.client() as client, server.client() as marking:
        marking.ping()  # connected before: its handshake is not counted
        with client.monitor() as monitor:
            result = call()
            marking.echo(marker)  # the end of the list
            entries = []
            while (entry := monitor.next_command())["command"] != f"ECHO {marker}":
                entries.append(entry)
    sent = [
        found["command"].split(" ", 1)[0].upper()
        for found in entries
        if found["client_type"] != "lua" and found["client_port"] != entry["client_port"]
    ]
    return result, sent


@pytest.mark.redis
def test_a_failed_acquire_naming_its_holder_costs_what_a_failed_acquire_did(make_redis_server):
    """Counted by the server, on a private one: MONITOR lists each command a client sends. A
    failed acquire of 0.1.0's script (``acquire``) and one that returns the holder
    (``acquire_as``) are both one EVALSHA: one round trip, no second command."""
    server = make_redis_server()
    store = RedisStore(url=server.url, max_connections=1)
    key, owner = "round-trips", _owner()
    other = Holder(host="web-3", pid=7, kind="web")
    # Connected, and every script loaded: what is counted below is the calls alone.
    assert isinstance(store.acquire_as(key, owner, 60_000, WORKER), int)
    assert store.acquire(key, _owner(), 60_000) is None
    assert isinstance(store.acquire_as(key, _owner(), 60_000, other), Holder)
    assert store.lease(key) is not None

    failed, before = _sent(server, lambda: store.acquire(key, _owner(), 60_000))
    assert (failed, before) == (None, ["EVALSHA"])
    found, now = _sent(server, lambda: store.acquire_as(key, _owner(), 60_000, other))
    assert isinstance(found, Holder) and (found.host, found.pid) == (WORKER.host, WORKER.pid)
    assert now == before
    token, taken = _sent(server, lambda: store.acquire_as("free", _owner(), 60_000, WORKER))
    assert isinstance(token, int) and taken == ["EVALSHA"]
    store.close()


@pytest.mark.redis
def test_the_holder_returned_expires_on_the_servers_clock(redis_server):
    store = RedisStore(url=redis_server.url, prefix=f"t{uuid.uuid4().hex[:8]}")
    store.acquire_as("k", _owner(), 60_000, WORKER)
    found = store.acquire_as("k", _owner(), 60_000, WORKER)
    with redis_server.client() as client:
        seconds, micros = client.time()
    now = datetime.datetime.fromtimestamp(seconds + micros / 1e6, tz=datetime.UTC)
    assert isinstance(found, Holder) and found.since and found.expires_at
    assert abs(found.expires_at - found.since - datetime.timedelta(seconds=60)) < ONE_SECOND
    assert abs(found.expires_at - now - datetime.timedelta(seconds=60)) < ONE_SECOND
    info = store.lease("k")
    assert info is not None and info.holder_info is not None
    assert info.acquired_at == found.since
    listed = info.holder_info.expires_at
    assert listed is not None and abs(listed - found.expires_at) < ONE_SECOND
    store.clear()


@pytest.mark.redis
def test_a_lease_of_the_previous_release_reads_as_a_process_holder(redis_server):
    """A lease written by 0.1.0's acquire script, called as a 0.1.0 process calls it (ARGV:
    owner, ttl, "host:pid", key): no kind, no detail, never renewed in the new way."""
    store = RedisStore(url=redis_server.url, prefix=f"t{uuid.uuid4().hex[:8]}")
    names = scripts.names(store.prefix, "old")
    old_owner = _owner()
    with redis_server.client() as client:
        token = client.eval(
            scripts.ACQUIRE_SCRIPT,
            2,
            names.lease,
            names.fence,
            old_owner,
            60_000,
            "old-1:77",
            "old",
        )
        # 0.1.0's renewal of its own lease works on the same layout, recording nothing.
        assert client.eval(scripts.RENEW_SCRIPT, 2, names.lease, names.fence, old_owner, 60_000)
    found = store.acquire_as("old", _owner(), 60_000, WORKER)
    assert isinstance(found, Holder)
    assert (found.host, found.pid, found.kind, found.detail) == ("old-1", 77, "process", "")
    assert found.since is not None and found.expires_at is not None
    info = store.lease("old")
    assert info is not None and info.holder_info is not None
    assert (info.fencing_token, info.holder, info.ended, info.last_renewed) == (
        token,
        "old-1 pid 77",
        None,
        None,
    )
    assert [lease.key for lease in store.leases()] == ["old"]
    store.clear()


@pytest.mark.redis
def test_the_previous_release_scripts_work_on_a_described_lease(redis_server):
    """What a 0.1.0 process does to a lease this release wrote: its listing reads it, its
    acquire finds it held, its operator's release frees it (a waiter woken), its acquire then
    takes the key with a greater token."""
    store = RedisStore(url=redis_server.url, prefix=f"t{uuid.uuid4().hex[:8]}")
    names = scripts.names(store.prefix, "new")
    owner = _owner()
    token = store.acquire_as("new", owner, 60_000, WORKER)
    assert isinstance(token, int) and store.renew("new", owner, 60_000)
    with redis_server.client() as client:
        listed = client.eval(scripts.INSPECT_SCRIPT, 1, names.lease)
        assert listed[:5] == [b"new", owner.encode(), b"web-2:4121", b"%d" % token, listed[4]]
        assert 0 < listed[5] <= 60_000
        taken = client.eval(
            scripts.ACQUIRE_SCRIPT, 2, names.lease, names.fence, _owner(), 1000, "old-1:77", "new"
        )
        assert taken is None
        assert client.eval(scripts.FORCE_RELEASE_SCRIPT, 3, names.lease, *names[1:3]) == 1
        assert client.lpop(names.released) == b"1"
        later = client.eval(
            scripts.ACQUIRE_SCRIPT, 2, names.lease, names.fence, _owner(), 1000, "old-1:77", "new"
        )
    assert later > token
    assert not store.renew("new", owner, 60_000)
    store.clear()


@pytest.mark.redis
def test_end_leave_and_force_end_work_and_record_nothing(redis_server):
    """Redis deletes a lease as it ends, so how it ended has nowhere to live: ``end`` is a
    release, ``leave`` a renewal not counted as one, ``force_end`` a force release."""
    store = RedisStore(url=redis_server.url, prefix=f"t{uuid.uuid4().hex[:8]}")
    for how in ("released", "handed back"):
        owner = _owner()
        store.acquire_as(how, owner, 60_000, WORKER)
        assert store.end(how, owner, how) is True
        assert store.end(how, owner, how) is False
        assert store.lease(how) is None
    left_as: tuple[LeaveReason, ...] = ("lapsed", "handed back")
    for how in left_as:
        key, owner = f"leave {how}", _owner()
        store.acquire_as(key, owner, 60_000, WORKER)
        assert store.renew(key, owner, 60_000)
        renewed = store.lease(key)
        assert renewed is not None and renewed.last_renewed is not None
        assert store.leave(key, owner, 300, how) is True
        left = store.lease(key)
        assert left is not None and left.expires_in is not None
        assert left.expires_in <= datetime.timedelta(milliseconds=300)
        assert (left.state, left.ended, left.last_renewed) == ("held", None, renewed.last_renewed)
        assert isinstance(store.acquire_as(key, _owner(), 60_000, WORKER), Holder)
        eventually(lambda: store.lease(key) is None, what=f"{key!r} lapsed")  # noqa: B023
        assert store.leave(key, owner, 300, how) is False
    owner = _owner()
    store.acquire_as("forced", owner, 60_000, WORKER)
    assert store.force_end("forced", "admin alice") is True
    assert store.force_end("forced", "admin alice") is False
    assert not store.renew("forced", owner, 60_000)
    store.clear()


@pytest.mark.redis
def test_a_detail_no_utf_8_can_hold_does_not_fail_an_acquire(redis_server):
    store = RedisStore(url=redis_server.url, prefix=f"t{uuid.uuid4().hex[:8]}")
    odd = Holder(host="web-\udcff", pid=1, kind="command", detail="task-\ud800-id")
    assert isinstance(store.acquire_as("k", _owner(), 60_000, odd), int)
    found = store.acquire_as("k", _owner(), 60_000, WORKER)
    assert isinstance(found, Holder) and (found.host, found.detail) == ("web-?", "task-?-id")
    store.clear()


@pytest.mark.redis
def test_a_lease_given_an_expiry_past_the_year_9999_by_hand_is_still_listed(redis_server):
    store = RedisStore(url=redis_server.url, prefix=f"t{uuid.uuid4().hex[:8]}")
    store.acquire_as("k", _owner(), 60_000, WORKER)
    with redis_server.client() as client:
        client.pexpire(store._keys("k")[0], 10**15)  # 31,000 years
    info = store.lease("k")
    assert info is not None and info.holder_info is not None
    assert info.holder_info.expires_at == datetime.datetime.max.replace(tzinfo=datetime.UTC)
    found = store.acquire_as("k", _owner(), 60_000, WORKER)
    assert isinstance(found, Holder) and found.expires_at == info.holder_info.expires_at
    store.clear()
