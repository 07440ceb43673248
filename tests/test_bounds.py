"""Bounds on every value entering the public surface, and background threads no value can kill
(issue 15: SPEC sections 2 and 10)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import io
import logging
import math
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_locks import (
    Lock,
    Locks,
    leader_election,
    on_one_instance,
    without_overlapping,
)
from django_locks import leader as leader_module
from django_locks.clock import MAX_WAIT, _TimerThread
from django_locks.decorators import job_spec
from django_locks.durations import MAX_DURATION_MS, MIN_TTL_MS, max_hold_ms, ttl_ms, wait_ms
from django_locks.exceptions import StoreError
from django_locks.keys import render_key
from django_locks.service import locks as default_locks
from django_locks.stores import DatabaseStore, InMemoryStore
from django_locks.stores.base import LockStore
from django_locks.stores.runtime import Watchdog
from tests.children.env import child_env

ROOT = Path(__file__).resolve().parent.parent
MEMORY = "django_locks.stores.InMemoryStore"
ALLOWED = {"BACKEND": MEMORY, "ALLOW_IN_MEMORY_STORAGE": True}
ABSURD_TTLS: list[object] = [
    "400000d",
    "367d",
    10**20,
    10**400,
    datetime.timedelta.max,
    float("inf"),
    float("nan"),
    "10ms",
    0.01,
    True,
    False,
]


def key() -> str:
    return f"bounds:{uuid.uuid4().hex[:10]}"


def names(error: BaseException, argument: str) -> bool:
    return f"`{argument}`" in str(error)


# The stores: every one the package ships.


@pytest.fixture
def memory_store() -> InMemoryStore:
    return InMemoryStore()


@pytest.fixture
def sqlite_store(transactional_db: None) -> Iterator[LockStore]:
    store = DatabaseStore("default")
    yield store
    store.clear()
    store.close()


@pytest.fixture
def pg_store(transactional_db: None) -> Iterator[LockStore]:
    store = DatabaseStore("postgres")
    yield store
    store.clear()
    store.close()


@pytest.fixture
def redis_store(redis_server: Any) -> Iterator[LockStore]:
    from django_locks.stores import RedisStore

    store = RedisStore(url=redis_server.url, prefix=f"bounds{uuid.uuid4().hex[:6]}")
    yield store
    store.clear()
    store.close()


ON_POSTGRES = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "postgres"]),
]
EVERY_STORE = pytest.fixture(
    params=[
        "memory_store",
        pytest.param("sqlite_store", marks=pytest.mark.django_db(transaction=True)),
        pytest.param("pg_store", marks=ON_POSTGRES),
        pytest.param("redis_store", marks=pytest.mark.redis),
    ]
)


@EVERY_STORE
def store(request: pytest.FixtureRequest) -> LockStore:
    return request.getfixturevalue(request.param)  # type: ignore[no-any-return]


# Defect 1 (and 5): absurd ttls and waits are refused before any I/O, on every store.


@pytest.mark.parametrize("ttl", ABSURD_TTLS, ids=repr)
def test_an_absurd_ttl_is_refused_on_every_store(store: LockStore, ttl: object) -> None:
    service = Locks(store)
    before = store.leases(include_inactive=True)
    name = key()
    for call in (
        lambda: service.acquire(name, ttl=ttl),  # type: ignore[arg-type]
        lambda: service.lock(name, ttl=ttl),  # type: ignore[arg-type]
        lambda: service.with_lock(name, lambda: None, ttl=ttl),  # type: ignore[arg-type]
        lambda: asyncio.run(service.aacquire(name, ttl=ttl)),  # type: ignore[arg-type]
        lambda: Locks(store, ttl=ttl),  # type: ignore[arg-type]
    ):
        with pytest.raises((ValueError, TypeError)) as caught:
            call()
        assert names(caught.value, "ttl"), caught.value
        assert "366 days" in str(caught.value)
    assert store.leases(include_inactive=True) == before


@pytest.mark.parametrize(
    "wait", ["400000d", 10**20, 10**400, datetime.timedelta.max, -1, math.nan, True, False]
)
def test_an_absurd_wait_is_refused_on_every_store(store: LockStore, wait: object) -> None:
    service = Locks(store)
    before = store.leases(include_inactive=True)
    for call in (
        lambda: service.acquire(key(), wait=wait),  # type: ignore[arg-type]
        lambda: service.lock(key(), wait=wait),  # type: ignore[arg-type]
        lambda: asyncio.run(service.aacquire(key(), wait=wait)),  # type: ignore[arg-type]
    ):
        with pytest.raises((ValueError, TypeError)) as caught:
            call()
        assert names(caught.value, "wait"), caught.value
    assert store.leases(include_inactive=True) == before


def test_the_longest_ttl_and_wait_are_accepted(store: LockStore) -> None:
    service = Locks(store, ttl="366d")
    name = key()
    with service.lock(name, wait="366d") as lock:
        assert lock.ttl == MAX_DURATION_MS / 1000
        assert service.acquire(name, ttl=datetime.timedelta(days=366)) is None
    shortest = service.acquire(name, ttl=MIN_TTL_MS / 1000)
    assert shortest is not None
    shortest.release()


def test_wait_false_is_refused_like_wait_true(memory_store: InMemoryStore) -> None:
    service = Locks(memory_store)
    for wait in (False, True):
        for call in (
            lambda w=wait: service.acquire("k", wait=w),
            lambda w=wait: service.lock("k", wait=w),
            lambda w=wait: service.with_lock("k", lambda: None, wait=w),
            lambda w=wait: asyncio.run(service.aacquire("k", wait=w)),
        ):
            with pytest.raises(TypeError, match="`wait`"):
                call()
    assert memory_store.leases(include_inactive=True) == []
    assert service.acquire("k", wait=0) is not None


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
def test_a_huge_ttl_ms_given_to_the_postgres_store_keeps_its_sql_functions(
    pg_store: DatabaseStore, caplog: pytest.LogCaptureFixture
) -> None:
    """An int too large for a bigint used to look like a missing function: the store then sent
    whole statements for the rest of the process and logged that `migrate` never ran."""
    with caplog.at_level(logging.WARNING, logger="django_locks"):
        with pytest.raises(StoreError):
            pg_store.acquire(key(), "o", 10**20)
    assert "SQL functions" not in caplog.text
    assert pg_store.acquire(key(), "o", 1000) is not None
    assert "SQL functions" not in caplog.text


def test_the_memory_store_lists_a_lease_of_any_length(memory_store: InMemoryStore) -> None:
    """The store itself takes any ttl_ms; leases() (the admin, `locks list`) must not crash."""
    memory_store.acquire("huge", "o", 10**17)
    (lease,) = memory_store.leases()
    assert lease.expires_in is not None and lease.expires_in.days > 10**8


# Defect 5: a ttl under 50 ms is refused at every entry point, the decorators when they decorate.


def test_a_10ms_ttl_is_refused_at_every_entry_point(memory_store: InMemoryStore) -> None:
    service = Locks(memory_store)
    calls: list[Callable[[], object]] = [
        lambda: Locks(memory_store, ttl="10ms"),
        lambda: service.acquire("k", ttl="10ms"),
        lambda: service.lock("k", ttl="10ms"),
        lambda: service.with_lock("k", lambda: None, ttl="10ms"),
        lambda: asyncio.run(service.aacquire("k", ttl="10ms")),
        lambda: service.alock("k", ttl="10ms"),
        lambda: asyncio.run(service.awith_lock("k", _nothing, ttl="10ms")),
        lambda: on_one_instance(ttl="10ms"),
        lambda: on_one_instance("k", ttl="10ms"),
        lambda: without_overlapping(ttl="10ms"),
        lambda: without_overlapping("k", ttl="10ms"),
        lambda: leader_election("bounds:leader", ttl="10ms"),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="`ttl` must be a positive duration of at least 50ms"):
            call()
    with pytest.raises(ValueError, match="`min_hold`"):
        on_one_instance(min_hold="400000d")
    assert memory_store.leases(include_inactive=True) == []


async def _nothing() -> None:
    return None


def test_leave_for_keeps_the_bounds_and_the_lease_when_refused(
    memory_store: InMemoryStore,
) -> None:
    lock = Locks(memory_store).acquire("k", ttl="30s")
    assert lock is not None
    for duration in ("400000d", 10**400, datetime.timedelta.max, 0, -1, math.inf, False):
        with pytest.raises((ValueError, TypeError), match="`duration`"):
            lock.leave_for(duration)
    assert lock.held
    (lease,) = memory_store.leases()
    assert lease.expires_in is not None and 25 < lease.expires_in.total_seconds() <= 30
    assert lock.leave_for("366d")
    (lease,) = memory_store.leases()
    assert lease.expires_in is not None and lease.expires_in.days == 365


def test_the_bound_helpers() -> None:
    assert ttl_ms("50ms") == 50 and ttl_ms("366d") == MAX_DURATION_MS == 31_622_400_000
    assert wait_ms(0) == 0 and wait_ms("366d") == MAX_DURATION_MS
    assert max_hold_ms(None) is None and max_hold_ms("1h") == 3_600_000
    helpers: list[tuple[Callable[[Any], object], str]] = [
        (ttl_ms, "ttl"),
        (wait_ms, "wait"),
        (max_hold_ms, "max_hold"),
    ]
    for helper, name in helpers:
        for value in ("366.001d", 10**400, datetime.timedelta.max, math.nan, -math.inf):
            with pytest.raises(ValueError, match=f"`{name}`"):
                helper(value)
        for wrong in (True, False, [1], b"1s"):
            with pytest.raises(TypeError, match=f"`{name}`"):
                helper(wrong)
    with pytest.raises(ValueError, match="`max_hold` must be None or a positive duration"):
        max_hold_ms("10ms")


# LOCKS["TTL"] / LOCKS["MIN_HOLD"]: refused at startup, reported by `manage.py check`.


@pytest.mark.parametrize(
    ("setting", "value"),
    [("TTL", "10ms"), ("TTL", "400000d"), ("TTL", 10**400), ("MIN_HOLD", "400000d")],
)
def test_locks_durations_out_of_bounds_refuse_to_start(setting: str, value: object) -> None:
    with override_settings(LOCKS={**ALLOWED, setting: value}):
        with pytest.raises(ImproperlyConfigured, match=f"`LOCKS\\['{setting}'\\]`"):
            apps.get_app_config("django_locks").ready()
        with pytest.raises(SystemCheckError, match="django_locks.E001"):
            call_command("check")


def test_locks_min_hold_may_be_zero() -> None:
    with override_settings(LOCKS={**ALLOWED, "MIN_HOLD": 0, "TTL": "366d"}):
        apps.get_app_config("django_locks").ready()
        assert default_locks.ttl_ms == MAX_DURATION_MS


# Defect 1 at its root: no wait of a background thread overflows, none dies.


def test_a_timer_past_timeout_max_does_not_kill_the_timer_thread() -> None:
    timers = _TimerThread()
    ran: list[str] = []
    fired = threading.Event()
    timers.call_at(time.monotonic() + 10 * threading.TIMEOUT_MAX, lambda: ran.append("far"))
    time.sleep(0.1)  # the thread now waits for the far timer (an hour at a time)
    timers.call_at(time.monotonic() + 0.05, fired.set)
    assert fired.wait(5), "the timer thread died"
    timers.call_at(math.nan, lambda: ran.append("nan"))  # never due
    with pytest.raises((TypeError, ValueError)):
        timers.call_at("soon", lambda: None)  # type: ignore[arg-type]
    fired.clear()
    timers.call_at(time.monotonic() + 0.05, lambda: 1 / 0)  # logged, the thread goes on
    timers.call_at(time.monotonic() + 0.1, fired.set)
    assert fired.wait(5), "the timer thread died"
    assert ran == []
    assert MAX_WAIT < threading.TIMEOUT_MAX / 1000


class _Call:
    """What the watchdog watches: a call with a deadline that it abandons."""

    def __init__(self) -> None:
        self.deadline = math.inf
        self.abandoned = threading.Event()

    def abandon(self) -> None:
        self.abandoned.set()


def test_a_deadline_past_timeout_max_does_not_kill_the_watchdog() -> None:
    watchdog = Watchdog()
    far, soon = _Call(), _Call()
    watchdog.watch(far, time.monotonic() + 10 * threading.TIMEOUT_MAX)  # type: ignore[arg-type]
    time.sleep(0.1)
    watchdog.watch(soon, time.monotonic() + 0.05)  # type: ignore[arg-type]
    assert soon.abandoned.wait(5), "the watchdog died: calls are no longer abandoned"
    assert not far.abandoned.is_set()


def test_after_a_far_timer_and_the_longest_ttl_short_locks_are_renewed_and_lost_by_deadline() -> (
    None
):
    """The issue's "must show", in a process of its own (its timer heap holds nothing else)."""
    env = child_env(settings="tests.settings")
    out = subprocess.run(
        [sys.executable, "-m", "tests.children.far_timer"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "renewed True" in out.stdout, out.stdout + out.stderr
    assert "lost True deadline" in out.stdout, out.stdout + out.stderr
    assert "Exception in thread" not in out.stderr, out.stderr  # a background thread died
    assert "OverflowError" not in out.stderr and "Traceback" not in out.stderr, out.stderr


# Defect 8: a command-line key that is not valid UTF-8, on every store.


def test_locks_release_of_a_key_that_is_not_utf8_is_a_clear_error(store: LockStore) -> None:
    out = io.StringIO()
    with _serving(store):
        for answer in ("--yes", None):
            args = ["release", "bad\udcff"] + ([answer] if answer else [])
            with pytest.raises(CommandError, match="surrogates") as caught:
                call_command("locks", *args, stdout=out, stdin=io.StringIO("y\n"))
            assert "`KEY`" in str(caught.value)
        with pytest.raises(CommandError, match="--older-than"):
            call_command("locks", "prune", "--older-than", "400000d", stdout=out)
        name = key()
        store.acquire(name, "o", 60_000)
        call_command("locks", "list", stdout=out)
        assert name in out.getvalue()


@contextlib.contextmanager
def _serving(store: LockStore) -> Iterator[None]:
    """The default service (``locks``: the commands, the decorators) on ``store`` for a block."""
    previous = default_locks._wrapped  # type: ignore[attr-defined]
    default_locks._wrapped = Locks(store)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        default_locks._wrapped = previous  # type: ignore[attr-defined]


def test_locks_list_shows_a_key_no_terminal_can_print(memory_store: InMemoryStore) -> None:
    # Only a store written behind the API's back can hold one: the listing still works.
    memory_store.acquire("odd\udcff", "o", 60_000)
    out = io.StringIO()
    with _serving(memory_store):
        call_command("locks", "list", stdout=out)
    assert "'odd\\udcff'" in out.getvalue()


def test_the_real_command_line_with_bytes_that_are_not_utf8() -> None:
    env = child_env(settings="tests.settings")
    out = subprocess.run(
        [sys.executable, "-m", "django", "locks", "release", b"bad\xff", "--yes"],
        capture_output=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )
    stderr = out.stderr.decode("utf-8", "replace")
    assert out.returncode == 1, stderr
    assert "CommandError" in stderr and "surrogates" in stderr
    assert "Traceback" not in stderr and "UnicodeEncodeError" not in stderr


# run_leader: durations refused naming the option; an unknown key exits 2 as documented.


def test_run_leader_options_out_of_bounds_and_unknown_keys() -> None:
    from tests.testapp.leaders import KEY

    for option, value in (("--ttl", "10ms"), ("--ttl", "400000d"), ("--grace", "400000d")):
        with pytest.raises(CommandError, match=f"`{option}`") as caught:
            call_command("run_leader", KEY, option, value)
        assert caught.value.returncode == 1
    with pytest.raises(CommandError, match="No @leader_election registered") as caught:
        call_command("run_leader", "no-such-election")
    assert caught.value.returncode == 2
    with pytest.raises(CommandError, match="at least one KEY") as caught:
        call_command("run_leader")
    assert caught.value.returncode == 2


def test_run_leader_with_an_unknown_key_exits_2() -> None:
    env = child_env(settings="tests.settings")
    out = subprocess.run(
        [sys.executable, "-m", "django", "run_leader", "no-such-election"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert "No @leader_election registered for 'no-such-election'" in out.stderr


# Defect 9: key templates.


def test_a_template_field_the_call_omits_is_a_value_error_naming_it(
    memory_store: InMemoryStore,
) -> None:
    def job(**kwargs: Any) -> None: ...

    with pytest.raises(ValueError, match="names 'customer'"):
        render_key("report:{customer}", job, (), {})
    assert render_key("report:{customer}", job, (), {"customer": 7}) == "report:7"

    def nested(item: Any, items: Any) -> None: ...

    with pytest.raises(ValueError, match=r"\{item\.pk\}"):
        render_key("x:{item.pk}", nested, (None, []), {})
    with pytest.raises(ValueError, match=r"\{items\[0\]\}"):
        render_key("x:{items[0]}", nested, (None, []), {})
    with pytest.raises(ValueError, match=r"\{items\[k\]\}"):
        render_key("x:{items[k]}", nested, (None, {}), {})

    @without_overlapping(f"bounds:{uuid.uuid4().hex[:6]}:{{customer}}")
    def decorated(**kwargs: Any) -> int:
        return 1

    with _serving(memory_store):
        with pytest.raises(ValueError, match="names 'customer'"):
            decorated()
        assert decorated(customer=3) == 1
    assert [lease.state for lease in memory_store.leases(include_inactive=True)] == ["released"]


# Property-based: whatever arrives at an entry point works or is a clear error, nothing written.

DURATIONS = st.one_of(
    st.integers(min_value=-(10**6), max_value=10**12),
    st.integers(),
    st.just(10**400),
    st.floats(),  # NaN and infinities included
    st.floats(min_value=0, max_value=4e7),
    st.timedeltas(),
    st.sampled_from([datetime.timedelta.max, datetime.timedelta.min, datetime.timedelta(0)]),
    st.from_regex(r"\A\s?\d{1,10}(\.\d{1,4})?\s?(ms|s|m|h|d)\s?\Z"),
    st.text(max_size=12),
    st.booleans(),
    st.none(),
    st.builds(object),
    st.lists(st.integers(), max_size=2),
    st.binary(max_size=4),
)
ODD = st.sampled_from(["\x00", "\ud800", "\udfff", "\udcff", "é", "\U0001d11e", ":", "#"])
KEYS = st.one_of(
    st.text(alphabet=st.one_of(st.characters(), ODD), max_size=600),
    st.text(max_size=40),
    st.integers(),
    st.none(),
    st.binary(max_size=8),
)
ARGUMENTS = st.one_of(
    st.integers(),
    st.floats(),
    st.text(alphabet=st.one_of(st.characters(), ODD), max_size=520),
    st.none(),
    st.booleans(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.builds(object),
)
PROPERTY = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


class _Checked:
    """One call at an entry point: it works, or it raises ``ValueError`` / ``TypeError`` naming
    one of ``arguments`` with nothing written to the store."""

    def __init__(self, store: InMemoryStore) -> None:
        self.store = store

    def __call__(self, call: Callable[[], object], *arguments: str) -> object:
        before = self.store.leases(include_inactive=True)
        try:
            result = call()
        except (ValueError, TypeError) as exc:
            assert any(_named(exc, argument) for argument in arguments), (arguments, exc)
            assert self.store.leases(include_inactive=True) == before
            return exc
        if isinstance(result, Lock):
            # Taken: then with a ttl in bounds, whatever it was given as.
            assert MIN_TTL_MS <= result.ttl * 1000 <= MAX_DURATION_MS, result.ttl
            result.release()
        elif isinstance(result, Locks):
            assert MIN_TTL_MS <= result.ttl_ms <= MAX_DURATION_MS, result.ttl_ms
        return result


def _named(error: BaseException, argument: str) -> bool:
    text = str(error)
    return f"`{argument}`" in text or (argument == "key" and "key template" in text)


@PROPERTY
@given(duration=DURATIONS, name=KEYS)
def test_property_acquire_lock_with_lock(duration: Any, name: Any) -> None:
    store = InMemoryStore()
    service, checked = Locks(store), _Checked(store)
    checked(lambda: service.acquire(name, ttl=duration), "key", "ttl")
    checked(lambda: service.acquire(name, wait=duration), "key", "wait")
    checked(lambda: _entered(service.lock(name, ttl=duration)), "key", "ttl")
    checked(lambda: service.with_lock(name, lambda: 1, ttl=duration, wait=0), "key", "ttl")
    checked(lambda: Locks(store, ttl=duration), "ttl")
    assert all(lease.state == "released" for lease in store.leases(include_inactive=True))


def _entered(block: Any) -> None:
    with block:
        pass


@PROPERTY
@given(duration=DURATIONS, name=KEYS)
def test_property_aacquire(duration: Any, name: Any) -> None:
    store = InMemoryStore()
    service, checked = Locks(store), _Checked(store)

    async def taken(**kwargs: Any) -> Lock | None:
        return await service.aacquire(name, **kwargs)  # released (and checked) by `checked`

    checked(lambda: asyncio.run(taken(ttl=duration)), "key", "ttl")
    checked(lambda: asyncio.run(taken(wait=duration)), "key", "wait")
    assert all(lease.state == "released" for lease in store.leases(include_inactive=True))


@PROPERTY
@given(duration=DURATIONS, other=DURATIONS)
def test_property_decorators_when_they_decorate(duration: Any, other: Any) -> None:
    store = InMemoryStore()
    checked = _Checked(store)
    suffix = uuid.uuid4().hex[:8]

    def job() -> None: ...

    once = checked(
        lambda: on_one_instance(f"p:{suffix}:a", ttl=duration, min_hold=other), "ttl", "min_hold"
    )
    run = checked(lambda: without_overlapping(f"p:{suffix}:b", ttl=duration), "ttl")
    for decorator in (once, run):
        if not isinstance(decorator, BaseException):
            spec = job_spec(decorator(job))  # type: ignore[operator]
            assert spec is not None
            for part in (spec.once, spec.run):
                if part is not None and part.ttl_ms is not None:
                    assert MIN_TTL_MS <= part.ttl_ms <= MAX_DURATION_MS
            if spec.once is not None and spec.once.min_hold_ms is not None:
                assert 0 <= spec.once.min_hold_ms <= MAX_DURATION_MS
    # Registered for run_leader only when valid: nothing half-registered when refused.
    election = checked(lambda: leader_election(f"p:{suffix}:c", ttl=duration), "ttl")
    if isinstance(election, BaseException):
        assert f"p:{suffix}:c" not in leader_module._elections
    assert store.leases(include_inactive=True) == []


@PROPERTY
@given(duration=DURATIONS)
def test_property_leave_for(duration: Any) -> None:
    store = InMemoryStore()
    lock = Locks(store).acquire("k", ttl="30s")
    assert lock is not None
    try:
        left = lock.leave_for(duration)
    except (ValueError, TypeError) as exc:
        assert "`duration`" in str(exc), exc
        assert lock.held  # refused before anything changed: still held, still renewed
        (lease,) = store.leases()
        assert lease.expires_in is not None and lease.expires_in.total_seconds() > 20
        lock.release()
    else:
        assert left is True and not lock.held
        (lease,) = store.leases()  # left in the store for `duration`, at most 366 days
        assert lease.expires_in is not None
        assert lease.expires_in.total_seconds() <= MAX_DURATION_MS / 1000


TEMPLATES = st.sampled_from(["{a}:{b}", "{a}", "{b}", "{a[0]}", "{a.real}", "{c}", "{b!r:>3}"])


@PROPERTY
@given(a=ARGUMENTS, b=ARGUMENTS, template=TEMPLATES)
def test_property_key_template_arguments(a: Any, b: Any, template: str) -> None:
    store = InMemoryStore()
    checked = _Checked(store)
    suffix = uuid.uuid4().hex[:8]

    @without_overlapping(f"p:{suffix}:" + template)
    def job(a: Any, **kwargs: Any) -> str:
        return "ran"

    with _serving(store):
        result = checked(lambda: job(a, b=b), "key")
    if result == "ran":
        assert [lease.state for lease in store.leases(include_inactive=True)] == ["released"]


@pytest.mark.parametrize("value", [10**400, 1e300, "400000d", 0, float("nan"), True])
def test_store_timeout_options_are_bounded(value: object) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from django_locks.stores.database import DatabaseStore
    from django_locks.stores.redis import RedisStore

    with pytest.raises(ImproperlyConfigured, match="`timeout`"):
        DatabaseStore("default", timeout=value)  # type: ignore[arg-type]
    for option in ("socket_timeout", "socket_connect_timeout"):
        with pytest.raises(ImproperlyConfigured, match=f"`{option}`"):
            RedisStore(url="redis://127.0.0.1:1/0", **{option: value})  # type: ignore[arg-type]


def test_an_abort_signal_waits_any_timeout_without_overflow() -> None:
    from django_locks import AbortSignal

    signal = AbortSignal()
    threading.Timer(0.1, signal.abort).start()
    assert signal.wait(1e20) is True  # beyond threading.TIMEOUT_MAX: waited in slices
    assert AbortSignal().wait(0.01) is False
    for bad in (float("nan"), True, "1s"):
        with pytest.raises(TypeError, match="`timeout`"):
            AbortSignal().wait(bad)  # type: ignore[arg-type]
