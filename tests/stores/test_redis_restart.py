"""RedisStore across redis-server restarts: held leases survive, tokens keep growing."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from django_locks.exceptions import StoreError
from django_locks.stores.redis import RedisStore
from tests.waiting import eventually

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def _owner() -> str:
    return uuid.uuid4().hex


class Churn:
    """Workers taking and releasing their own key in a loop, riding out a server outage.

    A call that fails is retried with the same owner: acquire is idempotent for its owner, so
    an acquire that ran on the server but whose answer was lost is not stranded.
    """

    def __init__(self, store: RedisStore, workers: int = 4) -> None:
        self.store = store
        self.tokens: dict[str, list[int]] = {f"churn{i}": [] for i in range(workers)}
        self.failures = 0
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(key,)) for key in self.tokens]

    def retry(self, call):
        while True:
            try:
                return call()
            except StoreError:
                self.failures += 1
                time.sleep(0.01)

    def run(self, key: str) -> None:
        try:
            while not self.stop.is_set():
                owner = _owner()
                token = self.retry(lambda o=owner: self.store.acquire(key, o, 60_000, timeout=1))
                assert token is not None, f"{key} stayed taken: a lease was stranded"
                self.tokens[key].append(token)
                self.retry(lambda o=owner: self.store.release(key, o, timeout=1))
        except BaseException as exc:
            self.errors.append(exc)

    def __enter__(self) -> Churn:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)
        assert self.errors == []
        print(f"{self.rounds()} rounds, {self.failures} failed calls during the outage")

    def rounds(self) -> int:
        return sum(len(tokens) for tokens in self.tokens.values())


def _take(store: RedisStore, keys: list[str]) -> dict[str, tuple[str, int]]:
    """Each key taken and released a few times, then held: {key: (owner, token)}."""
    held = {}
    for key in keys:
        for _ in range(3):
            owner = _owner()
            store.acquire(key, owner, 60_000)
            store.release(key, owner)
        owner = _owner()
        token = store.acquire(key, owner, 60_000)
        assert token is not None
        held[key] = (owner, token)
    return held


def _wait_for_rounds(churn: Churn, more_than: int) -> None:
    def going() -> bool:
        if churn.rounds() > more_than:
            return True
        assert not churn.errors, churn.errors
        return False

    eventually(going, timeout=20, every=0.02, what="the workers got going again")


@pytest.mark.parametrize("hard", [False, True], ids=["clean-shutdown", "kill-9"])
def test_restart_with_appendfsync_always_keeps_leases_and_tokens(make_redis_server, hard):
    server = make_redis_server({"appendfsync": "always"})
    store = RedisStore(url=server.url, max_connections=8)
    held = _take(store, [f"held{i}" for i in range(20)])
    with Churn(store) as churn:
        _wait_for_rounds(churn, 100)
        server.restart(hard=hard)
        _wait_for_rounds(churn, churn.rounds() + 100)
    for key, tokens in churn.tokens.items():
        assert tokens == sorted(set(tokens)), f"{key}: tokens went back across the restart"
    # No held lease was dropped: still held, by the same owner, with the same token.
    for key, (owner, token) in held.items():
        assert store.acquire(key, _owner(), 60_000) is None, f"{key} was freed by the restart"
        assert store.renew(key, owner, 60_000)
        assert store.acquire(key, owner, 60_000) == token
        assert store.release(key, owner)
        again = store.acquire(key, _owner(), 60_000)
        assert again is not None and again > token


def test_kill_9_with_appendfsync_everysec_keeps_tokens_growing(make_redis_server):
    # Redis write()s the append-only file before it replies; only the fsync is deferred. A
    # killed process loses nothing the kernel has; a crash of the machine can lose the last
    # second, and then the TIME floor (next test) is what keeps tokens growing.
    server = make_redis_server({"appendfsync": "everysec"})
    store = RedisStore(url=server.url, max_connections=8)
    held = _take(store, [f"held{i}" for i in range(10)])
    with Churn(store) as churn:
        _wait_for_rounds(churn, 100)
        server.restart(hard=True)
        _wait_for_rounds(churn, churn.rounds() + 100)
    for key, tokens in churn.tokens.items():
        assert tokens == sorted(set(tokens)), f"{key}: tokens went back across the restart"
    for key, (owner, token) in held.items():
        assert store.renew(key, owner, 60_000), f"{key} was freed by the restart"
        assert store.release(key, owner)
        again = store.acquire(key, _owner(), 60_000)
        assert again is not None and again > token


def test_a_restart_that_lost_everything_still_grows_tokens(make_redis_server):
    # The worst case of a lost write: no persistence at all. Held leases are gone (the hazard
    # the checks warn about: W201), but every new token is still greater than every token the
    # key had, because it is floored by the server's clock.
    server = make_redis_server({"appendonly": "no", "save": ""})
    store = RedisStore(url=server.url, max_connections=8)
    held = _take(store, [f"held{i}" for i in range(10)])
    with Churn(store) as churn:
        _wait_for_rounds(churn, 100)
        server.kill()
        server.wipe()
        server.start()
        _wait_for_rounds(churn, churn.rounds() + 100)
    for key, tokens in churn.tokens.items():
        assert tokens == sorted(set(tokens)), f"{key}: tokens went back after losing the data"
    for key, (owner, token) in held.items():
        assert not store.renew(key, owner, 60_000), "no persistence: the lease is gone"
        again = store.acquire(key, _owner(), 60_000)
        assert again is not None and again > token
