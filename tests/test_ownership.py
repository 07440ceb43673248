"""Ownership in one place: owner leases, leadership terms, the wait for a release, and the run
protocol the decorators drive; scans that keep each written once."""

from __future__ import annotations

import ast
import asyncio
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_locks import Locks, on_one_instance, registry, without_overlapping
from django_locks.exceptions import StoreError
from django_locks.holders import Holder
from django_locks.lock import Lock
from django_locks.notices import wait_for_release
from django_locks.ownership import OwnerLeases, Term, release_owner_leases
from django_locks.signals import leadership_acquired, leadership_lost
from django_locks.stores import InMemoryStore
from django_locks.testing import ManualClock
from tests.helpers import eventually, recording

PACKAGE = Path(__file__).resolve().parent.parent / "django_locks"
SIGNALS = {"leadership_acquired", "leadership_lost"}


# The scans.


def _functions(root: Path) -> Iterator[tuple[str, ast.AST]]:
    """``(qualified name, node)`` of every module, class and function under ``root`` (a
    package directory)."""
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        yield from _scopes(module, ast.parse(path.read_text(encoding="utf-8"), str(path)))


Scope = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def _scopes(name: str, node: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    yield name, node
    for child in _nested(node):
        yield from _scopes(f"{name}.{child.name}", child)


def _nested(node: ast.AST) -> Iterator[Scope]:
    """The functions and classes defined in ``node``'s own statements."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, Scope):
            yield child
        else:
            yield from _nested(child)


def _own_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``node`` outside the functions and classes nested in it."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, Scope):
            continue
        yield child
        yield from _own_nodes(child)


def _names(node: ast.AST) -> set[str]:
    found = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            found.add(child.id)
        elif isinstance(child, ast.Attribute):
            found.add(child.attr)
    return found


def leadership_senders(root: Path) -> set[str]:
    """Every function (or module) under ``root`` with a call naming ``leadership_acquired`` or
    ``leadership_lost``: sending one, or handing it to something that does."""
    return {
        name
        for name, node in _functions(root)
        if any(isinstance(n, ast.Call) and _names(n) & SIGNALS for n in _own_nodes(node))
    }


def release_wait_loops(root: Path) -> set[str]:
    """Every function under ``root``, its ``stores`` package aside, with a loop calling some
    ``x.wait_for_release(...)``: a loop waiting for release notices."""
    loops = set()
    for name, node in _functions(root):
        if ".stores." in f"{name}.":
            continue
        for loop in _own_nodes(node):
            if not isinstance(loop, ast.While | ast.For | ast.AsyncFor):
                continue
            calls = [n for n in _own_nodes(loop) if isinstance(n, ast.Call)]
            if any(
                isinstance(c.func, ast.Attribute) and c.func.attr == "wait_for_release"
                for c in calls
            ):
                loops.add(name)
    return loops


def leadership_tellers(root: Path) -> set[str]:
    """Every function (or module) under ``root`` making an ``Event`` of a leadership change:
    an ``Event(...)`` call naming the kind ``"leadership_acquired"`` or ``"leadership_lost"``."""
    kinds = {"leadership_acquired", "leadership_lost"}
    return {
        name
        for name, node in _functions(root)
        if any(
            isinstance(n, ast.Constant) and n.value in kinds
            for call in _own_nodes(node)
            if isinstance(call, ast.Call) and "Event" in _names(call.func)
            for n in ast.walk(call)
        )
    }


def test_one_function_sends_the_leadership_signals() -> None:
    # The signals are the event stream's first consumer: it sends them, from the events the
    # one announcer makes.
    assert leadership_senders(PACKAGE) == {"django_locks.signals.consume"}
    assert leadership_tellers(PACKAGE) == {"django_locks.ownership.announce_leadership"}


def test_one_loop_waits_for_release_notices() -> None:
    # The one loop of threads (a campaign's follower, an acquire's backoff), and the watcher
    # that serves every coroutine waiting on a key (one thread per key, whatever the number of
    # waiters: not the same loop, and below ownership in the imports).
    assert release_wait_loops(PACKAGE) == {
        "django_locks.notices.wait_for_release",
        "django_locks.aio.ReleaseNotices._watch",
    }


def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root / "pkg"


def test_the_scans_find_a_second_sender_and_a_second_loop(tmp_path: Path) -> None:
    root = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "one.py": """\
                from django_locks import signals
                def announce(key):
                    signals.send(signals.leadership_acquired, None, key=key)
                class Beat:
                    def lead(self):
                        def inner():
                            send(leadership_lost, key=1)
                        return inner
                    def wait(self, store):
                        while True:
                            if store.wait_for_release("k", 0.25):
                                return
                """,
            "two.py": """\
                def follow(store):
                    for _ in range(3):
                        store.wait_for_release("k", 0.25)
                def fine(store):
                    return store.wait_for_release("k", 0.25)  # no loop
                connect = getattr(None, "on_leadership_lost", None)  # a name, not the signal
                """,
            "stores/__init__.py": "",
            "stores/memory.py": "def wait(s):\n    while s.wait_for_release('k', 1):\n"
            "        pass\n",
        },
    )
    assert leadership_senders(root) == {"pkg.one.announce", "pkg.one.Beat.lead.inner"}
    assert release_wait_loops(root) == {"pkg.one.Beat.wait", "pkg.two.follow"}


# Owner leases.


def taken(found: Lock | Holder | None) -> Lock:
    """What ``OwnerLeases.take`` answered, which must be the lease taken."""
    assert isinstance(found, Lock), found
    return found


class CountingStore(InMemoryStore):
    """The in-memory store, counting its acquire calls (``acquire_as``: what the service calls)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.acquires = 0

    def acquire_as(self, key: str, owner: str, ttl_ms: int, holder: Any, **kwargs: Any) -> Any:
        self.acquires += 1
        return super().acquire_as(key, owner, ttl_ms, holder, **kwargs)


@pytest.fixture
def service() -> Iterator[Locks]:
    locks = Locks(CountingStore(), ttl="2s")
    yield locks
    locks.store.close()


def test_a_lease_taken_is_held_without_a_store_call(service: Locks) -> None:
    leases = OwnerLeases(lambda: service)
    lock = taken(leases.take("job", "ownership:a:owner"))
    assert lock is not None and lock.held
    store: Any = service.store
    assert store.acquires == 1
    assert leases.held("ownership:a:owner") is lock
    assert leases.take("job", "ownership:a:owner") is lock
    assert store.acquires == 1
    elsewhere = OwnerLeases(lambda: service)  # another process, as far as leases go
    assert isinstance(elsewhere.take("job", "ownership:a:owner"), Holder)
    assert elsewhere.held("ownership:a:owner") is None
    leases.hand_back()
    assert not lock.held
    assert leases.held("ownership:a:owner") is None
    assert elsewhere.take("job", "ownership:a:owner") is not None
    elsewhere.hand_back()


def test_a_lease_is_taken_with_its_ttl(service: Locks) -> None:
    leases = OwnerLeases(lambda: service)
    lock = taken(leases.take("job", "ownership:ttl:owner", 500))
    assert lock is not None and lock.ttl == 0.5
    leases.hand_back()


def test_hand_back_with_a_grace_leaves_the_lease_for_the_grace(service: Locks) -> None:
    told: list[tuple[str, float]] = []
    leases = OwnerLeases(
        lambda: service, handed_back=lambda lock, grace: told.append((lock.key, grace))
    )
    graced = taken(leases.take("job", "ownership:graced:owner"))
    at_once = taken(leases.take("job", "ownership:at-once:owner"))
    assert graced is not None and at_once is not None
    leases.hand_back(lambda lock: 0.6 if lock is graced else 0)
    handed_back = time.monotonic()
    assert not graced.held and not at_once.held
    assert told == [("ownership:graced:owner", 0.6), ("ownership:at-once:owner", 0)]
    assert service.acquire("ownership:at-once:owner") is not None  # free at once
    assert service.acquire("ownership:graced:owner") is None  # kept for the grace...
    eventually(
        lambda: service.acquire("ownership:graced:owner") is not None, timeout=5, what="free"
    )
    assert time.monotonic() - handed_back >= 0.5  # ...then it lapses, unrenewed


def test_a_failing_hand_back_does_not_keep_the_others(
    service: Locks, caplog: pytest.LogCaptureFixture
) -> None:
    leases = OwnerLeases(lambda: service)
    failing = taken(leases.take("job", "ownership:failing:owner"))
    other = taken(leases.take("job", "ownership:other:owner"))
    assert failing is not None and other is not None
    real_end = service.store.end

    def end(key: str, owner: str, how: Any, **kwargs: Any) -> bool:
        if key == "ownership:failing:owner":
            raise StoreError("release: store unreachable (injected)")
        return real_end(key, owner, how, **kwargs)

    service.store.end = end  # type: ignore[method-assign]
    leases.hand_back()
    assert (
        "Handing back 'ownership:failing:owner' failed (release: store unreachable" in caplog.text
    )
    assert not other.held and service.acquire("ownership:other:owner") is not None


def test_a_lost_lease_is_not_held() -> None:
    store_clock = ManualClock()
    store = InMemoryStore(clock=store_clock)
    service = Locks(store, ttl="1s", clock=ManualClock())  # its holder pauses
    leases = OwnerLeases(lambda: service)
    lock = taken(leases.take("job", "ownership:lost:owner"))
    assert lock is not None
    store_clock.advance("2s")
    assert store.acquire("ownership:lost:owner", "another-owner", 1000) is not None
    service.clock.advance("1s")  # type: ignore[attr-defined]
    assert not lock.held
    assert leases.held("ownership:lost:owner") is None
    assert isinstance(leases.take("job", "ownership:lost:owner"), Holder)  # the other owner has it


# Leadership terms.


def test_a_term_is_announced_when_it_begins_and_once_when_it_ends(service: Locks) -> None:
    lock = service.acquire("ownership:term")
    assert lock is not None
    with recording(leadership_acquired) as acquired, recording(leadership_lost) as lost:
        term = Term("ownership:term", lock)
        assert term.end("released")
        assert not term.end("lost")
    token = lock.fencing_token
    assert acquired == [{"key": "ownership:term", "fencing_token": token, "lock": lock}]
    assert lost == [{"key": "ownership:term", "fencing_token": token, "reason": "released"}]
    lock.release()


# The wait for a release.


def test_the_wait_ends_at_a_release(service: Locks) -> None:
    lock = service.acquire("ownership:wait")
    assert lock is not None
    threading.Timer(0.3, lock.release).start()
    started = time.monotonic()
    assert wait_for_release(service.store, "ownership:wait", started + 5) == "released"
    assert time.monotonic() - started < 2


def test_the_wait_ends_at_its_time_or_at_a_stop(service: Locks) -> None:
    started = time.monotonic()
    assert wait_for_release(service.store, "ownership:none", started + 0.3) == "waited"
    assert 0.25 < time.monotonic() - started < 2
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    assert wait_for_release(service.store, "ownership:none", started + 10, stop=stop) == "waited"
    assert time.monotonic() - started < 2


class NoNotices(InMemoryStore):
    def wait_for_release(self, key: str, timeout: float) -> bool:
        raise NotImplementedError


class FailingNotices(InMemoryStore):
    """Its notice channel is down: every wait fails at once."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait_for_release(self, key: str, timeout: float) -> bool:
        self.waits += 1
        raise StoreError("wait_for_release: channel down (injected)")


def test_a_store_without_notices_sleeps_the_wait() -> None:
    started = time.monotonic()
    assert wait_for_release(NoNotices(), "ownership:n", started + 0.3) == "no notices"
    assert 0.25 < time.monotonic() - started < 2


def test_a_failing_notice_channel_is_tried_again_each_slice() -> None:
    store = FailingNotices()
    started = time.monotonic()
    assert wait_for_release(store, "ownership:f", started + 0.6) == "waited"
    assert 0.55 < time.monotonic() - started < 2
    assert 2 <= store.waits <= 4  # a slice slept after each failure, not a busy loop


# The run protocol, as the decorators drive it.


@pytest.mark.usefixtures("locks_reset")
def test_a_jobs_own_stop_iteration_is_raised_as_it_is() -> None:
    # The protocol is a generator: the job's StopIteration must not become its RuntimeError.
    @on_one_instance("ownership:stop")
    @without_overlapping
    def stops() -> None:
        raise StopIteration("the job's own")

    try:
        with pytest.raises(StopIteration, match="the job's own"):
            stops()
    finally:
        release_owner_leases()
        registry.unclaim(registry.job_for(stops, kind="job", key="ownership:stop"))


@pytest.mark.usefixtures("locks_reset")
def test_a_cancelled_async_run_releases_its_run_lock() -> None:
    from django_locks import locks

    started = asyncio.Event()

    @without_overlapping("ownership:cancelled")
    async def slow() -> None:
        started.set()
        await asyncio.sleep(30)

    async def main() -> None:
        task = asyncio.ensure_future(slow())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(main())
        again = locks.acquire("ownership:cancelled")
        assert again is not None  # the release ran to its end before CancelledError
        again.release()
    finally:
        registry.unclaim(registry.job_for(slow, kind="job", key="ownership:cancelled"))
