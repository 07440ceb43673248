"""``release="on_commit"`` on real servers: the PostgreSQL ``DatabaseStore`` (following its own
alias), the SQLite ``DatabaseStore`` of the suite's default database, and the Redis store with
``using=`` the PostgreSQL alias. A competitor in another thread asks the store through a
connection of its own, as another process would. Also: the refusals (several aliases, the async
forms, bad arguments) and ``TestCase``'s wrapping transaction."""

from __future__ import annotations

import asyncio
import threading
import time
import unittest
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connections, transaction
from django.db.transaction import TransactionManagementError
from django.test import TestCase
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_locks import Lock, Locks
from django_locks.stores.database import DatabaseStore
from tests.helpers import competitor_gets

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "postgres"]),
]


class Boom(Exception):
    pass


class Case:
    """A service on one store, and the alias whose transaction its blocks follow."""

    def __init__(self, service: Locks, alias: str, using: str | None) -> None:
        self.service = service
        self.alias = alias
        self.using = using

    def lock(self, key: str) -> Any:
        return self.service.lock(key, release="on_commit", using=self.using)

    def atomic(self) -> Any:
        return transaction.atomic(using=self.alias)

    def free(self, key: str) -> bool:
        """Whether a competitor in another thread (another connection) gets ``key`` now."""
        return competitor_gets(self.service, key)


@pytest.fixture(
    params=[
        pytest.param("postgres", id="postgres"),
        pytest.param("sqlite", id="sqlite"),
        pytest.param("redis", marks=pytest.mark.redis, id="redis"),
    ]
)
def case(request: pytest.FixtureRequest) -> Iterator[Case]:
    if request.param == "redis":
        from django_locks.stores.redis import RedisStore

        server = request.getfixturevalue("redis_server")
        store: Any = RedisStore(url=server.url)
        alias, using = "postgres", "postgres"
    else:
        alias = "postgres" if request.param == "postgres" else "default"
        store, using = DatabaseStore(alias), None
    yield Case(Locks(store, ttl="30s"), alias, using)
    store.close()


def key() -> str:
    return f"oncommit:{uuid.uuid4().hex[:10]}"


def poll(check: Callable[[], bool], seconds: float = 5.0) -> bool:
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        if check():
            return True
        time.sleep(0.02)
    return check()


def test_a_competitor_acquires_only_after_the_commit(case: Case) -> None:
    name = key()
    acquired: list[float] = []

    def compete() -> None:
        lock = case.service.acquire(name, wait=20)
        if lock is not None:
            acquired.append(time.monotonic())
            lock.release()

    with case.atomic():
        with case.lock(name) as lock:
            pass
        competitor = threading.Thread(target=compete)
        competitor.start()
        time.sleep(1.0)  # the competitor keeps trying (woken by release notices) meanwhile
        assert lock.held and acquired == []
        committed = time.monotonic()
    competitor.join(20)
    assert not lock.held
    assert len(acquired) == 1 and acquired[0] >= committed


def test_released_at_once_after_an_outer_rollback(case: Case) -> None:
    name = key()
    with pytest.raises(Boom), case.atomic():
        with case.lock(name) as lock:
            pass
        assert not case.free(name)
        raise Boom
    assert lock._keeper.state == "released"
    assert case.free(name)


def test_released_at_once_after_a_savepoint_rollback(case: Case) -> None:
    name = key()
    with case.atomic():
        with pytest.raises(Boom), case.atomic():
            with case.lock(name) as lock:
                pass
            raise Boom
        # Still inside the outer transaction, which wrote nothing: the key is free already,
        # released in this thread (on the in-memory SQLite database, from the background it
        # would interleave with Django's release of the savepoint on the one connection).
        assert lock._keeper.state == "released"
        assert case.free(name)


def test_released_at_once_when_the_connection_closes(case: Case) -> None:
    if case.alias == "default":
        # Django ignores close() on an in-memory SQLite database (it would destroy it): the
        # in-memory store's tests close a connection of SQLite files in tests/children.
        assert connections["default"].is_in_memory_db()  # type: ignore[attr-defined]
        case = Case(case.service, "postgres", "postgres")
    name = key()
    conn = connections[case.alias]
    with pytest.raises(Boom), case.atomic():
        with case.lock(name) as lock:
            pass
        conn.close()
        assert lock._keeper.state == "released"
        assert case.free(name)
        raise Boom


def failing_hook() -> None:
    raise Boom


def test_released_despite_an_earlier_failing_on_commit_callback(case: Case) -> None:
    name = key()
    raised = False
    try:
        with case.atomic():
            transaction.on_commit(failing_hook, using=case.alias)  # not robust: stops the rest
            with case.lock(name) as lock:
                pass
    except Boom:
        raised = True  # the traceback (and the callbacks its frames kept) dropped here
    assert raised
    # Well before the timer's ttl/3 (10 s): the finalizer saw Django drop the callback.
    assert poll(lambda: lock._keeper.state == "released", 2)
    assert case.free(name)


def test_a_block_inside_transactions_on_several_aliases_is_refused(case: Case) -> None:
    name = key()
    other = "default" if case.alias == "postgres" else "postgres"
    with transaction.atomic(using=case.alias), transaction.atomic(using=other):
        with pytest.raises(TransactionManagementError, match="on 'postgres'|on 'default'"):
            with case.lock(name):
                raise AssertionError("the block must not run")
        with pytest.raises(TransactionManagementError):
            case.service.with_lock(name, lambda: None, release="on_commit", using=case.using)
    assert case.service.store.lease(name) is None  # nothing written


async def nap() -> None:
    await asyncio.sleep(0)


def test_the_async_forms_refuse_on_commit(case: Case) -> None:
    name = key()

    async def forms() -> list[str]:
        refused = []
        for form in (
            lambda: case.service.aacquire(name, release="on_commit"),
            lambda: case.service.awith_lock(name, nap, release="on_commit"),
        ):
            with pytest.raises(TypeError, match="release='on_commit'") as caught:
                await form()
            refused.append(str(caught.value))
        with pytest.raises(TypeError, match="Django has no async"):
            case.service.alock(name, release="on_commit")
        return refused

    messages = asyncio.run(forms())
    assert [m.split(" ", 1)[0] for m in messages] == ["aacquire()", "awith_lock()"]
    assert case.service.store.lease(name) is None


RELEASES = st.one_of(
    st.text(max_size=12).filter(lambda s: s not in ("on_exit", "on_commit")),
    st.none(),
    st.integers(),
    st.booleans(),
    st.just(b"on_commit"),
    st.just(["on_commit"]),
)
ALIASES = st.one_of(
    st.text(max_size=12).filter(lambda s: s not in ("default", "postgres")),
    st.integers(),
    st.just(b"default"),
    st.just(["default"]),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(release=RELEASES, using=ALIASES)
def test_bad_release_and_using_values_are_refused_naming_them(
    case: Case, release: Any, using: Any
) -> None:
    name = key()
    for call in (
        lambda: case.service.lock(name, release=release),
        lambda: case.service.with_lock(name, lambda: None, release=release),
    ):
        with pytest.raises(ValueError, match="`release` must be 'on_exit' or 'on_commit'"):
            call()
    with pytest.raises(ValueError, match="`using` must be an alias of DATABASES"):
        case.service.lock(name, release="on_commit", using=using)
    with pytest.raises(ValueError, match="`using`.*leave it None"):
        case.service.lock(name, using=using)
    assert case.service.store.lease(name) is None


# Under Django's TestCase: its wrapping transaction never commits. The release comes at the
# test's rollback, unless captureOnCommitCallbacks(execute=True) runs it. The TestCase runs here,
# under unittest's runner, so that what it left behind can be checked after its rollback.

SEEN: dict[str, Any] = {}


class OnCommitUnderTestCase(TestCase):
    __test__ = False  # run by run_testcase() below, not collected by pytest
    databases = {"default", "postgres"}
    service: Locks

    def test_held_until_the_tests_rollback(self) -> None:
        with self.service.lock(SEEN["key"], release="on_commit") as lock:
            pass
        SEEN["held_in_test"] = lock.held
        SEEN["lock"] = lock

    def test_released_by_capture_on_commit_callbacks(self) -> None:
        with self.captureOnCommitCallbacks(using="postgres", execute=True) as callbacks:
            with self.service.lock(SEEN["key"], release="on_commit") as lock:
                pass
            SEEN["held_in_capture"] = lock.held
        SEEN["callbacks"] = len(callbacks)
        SEEN["released_after_capture"] = lock._keeper.state == "released"


def run_testcase(name: str, service: Locks) -> unittest.TestResult:
    OnCommitUnderTestCase.service = service
    result = unittest.TestResult()
    unittest.TestSuite([OnCommitUnderTestCase(name)]).run(result)
    assert result.wasSuccessful(), result.errors + result.failures
    return result


@pytest.fixture
def pg_service() -> Iterator[Locks]:
    store = DatabaseStore("postgres")
    yield Locks(store, ttl="30s")
    store.close()


def test_under_testcase_the_lock_is_released_at_the_tests_rollback(pg_service: Locks) -> None:
    SEEN.clear()
    SEEN["key"] = key()
    run_testcase("test_held_until_the_tests_rollback", pg_service)
    lock: Lock = SEEN["lock"]
    assert SEEN["held_in_test"] is True
    assert poll(lambda: lock._keeper.state == "released")
    assert Case(pg_service, "postgres", None).free(SEEN["key"])


def test_under_testcase_capture_on_commit_callbacks_executes_the_release(
    pg_service: Locks,
) -> None:
    SEEN.clear()
    SEEN["key"] = key()
    run_testcase("test_released_by_capture_on_commit_callbacks", pg_service)
    assert SEEN["held_in_capture"] is True
    assert SEEN["callbacks"] == 1
    assert SEEN["released_after_capture"] is True
