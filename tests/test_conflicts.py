"""What a run that finds its run lock taken does (SPEC section 12): ``on_conflict`` and ``wait``
on plain functions, coroutines and management commands run in this process, on the in-memory
store, PostgreSQL and Redis (the configured service, ``LOCKS`` set per test).

Another instance is played by a thread running the job, or by taking the key directly. Celery
tasks, on a real worker, are in test_celery_conflicts.py; commands in several processes in
test_commands_decorated.py.
"""

from __future__ import annotations

import asyncio
import io
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command

from django_locks import (
    LockLostError,
    LockNotAcquiredError,
    PreemptedError,
    current_lock,
    limit_concurrency,
    locks,
    on_one_instance,
    registry,
    without_overlapping,
)
from django_locks.decorators import release_owner_leases
from django_locks.ownership import IN_PROGRESS, NOT_REPLACED
from django_locks.signals import lock_lost, run_skipped
from django_locks.stores import InMemoryStore
from django_locks.testing import reset_locks
from tests.helpers import SERVICE_STORES, configure_service, eventually, recording

pytestmark = pytest.mark.usefixtures("locks_reset")


@pytest.fixture(params=SERVICE_STORES)
def store(request: pytest.FixtureRequest, settings: Any) -> Iterator[str]:
    """The configured service on each store offering what the policies need."""
    configure_service(request, settings, "conflicts")
    yield request.param
    reset_locks()  # (locks_reset clears the in-memory store the settings go back to)


def name() -> str:
    return uuid.uuid4().hex[:10]


class Holder:
    """A run of a job in a thread, started and held until its lock's signal aborts (``obey``)
    or ``hold`` seconds passed."""

    def __init__(self, job: Any, *args: Any) -> None:
        self.started = threading.Event()
        self.result: Any = None
        self.thread = threading.Thread(target=self._run, args=(job, args))
        self.thread.start()
        assert self.started.wait(10), "the holder's run started"

    def _run(self, job: Any, args: tuple[Any, ...]) -> None:
        self.result = job(*args, started=self.started)

    def join(self) -> Any:
        self.thread.join(20)
        assert not self.thread.is_alive()
        return self.result


Held = tuple[Any, int, float, float]
"""What a holding job returns: its signal's reason, its token, when its body began and ended."""


def hold(started: threading.Event | None, seconds: float, obey: bool) -> Held:
    """A job's body: hold the run lock, then say how it ended (:data:`Held`)."""
    lock = current_lock()
    assert lock is not None
    began = time.monotonic()
    if started is not None:
        started.set()
    if obey:
        lock.signal.wait(seconds)
    else:
        time.sleep(seconds)
    return lock.signal.reason, lock.fencing_token, began, time.monotonic()


def ran(result: Held | None) -> Held:
    """The result of a run that was not skipped."""
    assert result is not None, "the run was skipped"
    return result


async def ahold(started: threading.Event | None, seconds: float, obey: bool) -> Held:
    lock = current_lock()
    assert lock is not None
    began = time.monotonic()
    if started is not None:
        started.set()
    if obey:
        await lock.signal.wait_async(seconds)
    else:
        await asyncio.sleep(seconds)
    return lock.signal.reason, lock.fencing_token, began, time.monotonic()


# The jobs: one key template each, rendered per test.


@without_overlapping("conflicts:skip:{n}", ttl="10s")
def skipping(n: str) -> int:
    return 1


@without_overlapping("conflicts:raise:{n}", ttl="10s", on_conflict="raise")
def raising(n: str) -> int:
    return 1


@limit_concurrency("conflicts:permits-raise:{n}", permits=2, ttl="10s", on_conflict="raise")
def raising_permits(n: str) -> int:
    return 1


@without_overlapping("conflicts:wait:{n}", ttl="10s", wait="5s")
def waiting(n: str) -> float:
    return time.monotonic()


@without_overlapping("conflicts:wait-out:{n}", ttl="10s", wait="300ms")
def waiting_out(n: str) -> int:
    return 1


@without_overlapping("conflicts:wait-raise:{n}", ttl="10s", wait="300ms", on_conflict="raise")
def waiting_raise(n: str) -> int:
    return 1


@without_overlapping("conflicts:replace:{n}", ttl="1s", on_conflict="replace")
def replacing(
    n: str, seconds: float = 0.0, obey: bool = True, started: threading.Event | None = None
) -> Held:
    return hold(started, seconds, obey)


# The preempt request is read within ttl/3 (1 s); a run that ignores its signal keeps the lease
# at least 2 ttl/3 (2 s) after it: past the wait.
@without_overlapping("conflicts:stubborn:{n}", ttl="3s", wait="1s", on_conflict="replace")
def replacing_briefly(
    n: str, seconds: float = 0.0, obey: bool = True, started: threading.Event | None = None
) -> Held:
    return hold(started, seconds, obey)


@limit_concurrency("conflicts:permits-replace:{n}", permits=2, ttl="1s", on_conflict="replace")
def replacing_permits(
    n: str, seconds: float = 0.0, obey: bool = True, started: threading.Event | None = None
) -> Held:
    return hold(started, seconds, obey)


@without_overlapping("conflicts:retry:{n}", ttl="10s", on_conflict="retry")
def retrying(n: str) -> int:
    return 1


@without_overlapping("conflicts:async-skip:{n}", ttl="10s")
async def askipping(n: str) -> int:
    return 1


@without_overlapping("conflicts:async-raise:{n}", ttl="10s", on_conflict="raise", wait="200ms")
async def araising(n: str) -> int:
    return 1


@without_overlapping("conflicts:async-wait:{n}", ttl="10s", wait="5s")
async def awaiting(n: str) -> float:
    return time.monotonic()


@without_overlapping("conflicts:async-replace:{n}", ttl="1s", on_conflict="replace")
async def areplacing(
    n: str, seconds: float = 0.0, obey: bool = True, started: threading.Event | None = None
) -> Held:
    return await ahold(started, seconds, obey)


@without_overlapping("conflicts:async-retry:{n}", ttl="10s", on_conflict="retry")
async def aretrying(n: str) -> int:
    return 1


# skip


def test_skip_logs_the_rendered_key_and_the_holder(store: str, caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="django_locks")
    n = name()
    held = locks.acquire(f"conflicts:skip:{n}")
    assert held is not None
    with recording(run_skipped) as skips:
        assert skipping(n) is None
    held.release()
    assert skips == [{"key": f"conflicts:skip:{n}", "reason": IN_PROGRESS, "code": "in_progress"}]
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("Skipped"))
    assert line.startswith(
        f"Skipped tests.test_conflicts.skipping (key 'conflicts:skip:{n}'): a run is still in "
        "progress (held by "
    ), line
    assert " pid " in line
    assert skipping(n) == 1


# raise


def test_raise_names_the_key_the_wait_and_the_holder(store: str) -> None:
    n = name()
    held = locks.acquire(f"conflicts:raise:{n}")
    assert held is not None
    with recording(run_skipped) as skips, pytest.raises(LockNotAcquiredError) as raised:
        raising(n)
    held.release()
    error = raised.value
    assert (error.key, error.wait, error.permits) == (f"conflicts:raise:{n}", 0, 1)
    assert error.holder is not None and error.holder.pid is not None
    assert "held by" in str(error)
    assert skips == []  # not a skipped run: it failed
    assert raising(n) == 1


def test_raise_under_permits_names_the_first_holder_to_end(store: str) -> None:
    n = name()
    key = f"conflicts:permits-raise:{n}"
    held = [locks.acquire(key, permits=2) for _ in range(2)]
    with pytest.raises(LockNotAcquiredError) as raised:
        raising_permits(n)
    for lock in held:
        assert lock is not None
        lock.release()
    assert raised.value.permits == 2 and raised.value.key == key
    assert "Every one of the 2 permits" in str(raised.value)


# wait


def test_wait_runs_once_the_holder_lets_go(store: str) -> None:
    n = name()
    held = locks.acquire(f"conflicts:wait:{n}")
    assert held is not None
    released = threading.Timer(0.4, held.release)
    began = time.monotonic()
    released.start()
    ran_at = waiting(n)
    released.join()
    assert ran_at is not None
    assert 0.35 < ran_at - began < 4.0


def test_a_wait_that_runs_out_then_applies_the_policy(store: str) -> None:
    n = name()
    held = [locks.acquire(f"conflicts:wait-out:{n}"), locks.acquire(f"conflicts:wait-raise:{n}")]
    began = time.monotonic()
    with recording(run_skipped) as skips:
        assert waiting_out(n) is None
    assert time.monotonic() - began >= 0.3
    assert [skip["code"] for skip in skips] == ["in_progress"]
    with pytest.raises(LockNotAcquiredError) as raised:
        waiting_raise(n)
    assert raised.value.wait == pytest.approx(0.3)
    assert "after waiting 0.3s" in str(raised.value)
    for lock in held:
        assert lock is not None
        lock.release()


# replace


def test_replace_stops_the_running_one_and_runs_after_it(store: str, caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="django_locks")
    n = name()
    with recording(run_skipped) as skips, recording(lock_lost) as lost:
        running = Holder(replacing, n, 30.0)
        reason, token, began, _ = ran(replacing(n))
        old_reason, old_token, _, old_ended = running.join()
    assert isinstance(old_reason, PreemptedError)
    assert old_reason.detected_by == "preempted" and old_reason.fencing_token == old_token
    assert reason is None and token > old_token
    assert began >= old_ended  # the new run began after the old one's body ended
    assert skips == [] and lost == []  # nothing skipped, nothing lost to a failure
    replacing_line = f"Replacing tests.test_conflicts.replacing (key 'conflicts:replace:{n}')"
    assert f"{replacing_line}: asked the run holding fencing token {old_token} to stop" in (
        caplog.text
    )


def test_replace_whose_holder_never_stops_is_not_replaced_after_the_wait(store: str) -> None:
    n = name()
    key = f"conflicts:stubborn:{n}"
    # A holder that never reads the request within the wait (renewed every 20 s).
    held = locks.acquire(key, ttl="60s")
    assert held is not None
    began = time.monotonic()
    with recording(run_skipped) as skips:
        assert replacing_briefly(n) is None
    waited = time.monotonic() - began
    assert 1.0 <= waited < 5.0
    assert skips == [{"key": key, "reason": NOT_REPLACED, "code": "not_replaced"}]
    assert held.held
    held.release()


def test_replace_of_a_run_that_ignores_its_signal_is_not_replaced(store: str) -> None:
    n = name()
    running = Holder(replacing_briefly, n, 4.0, False)
    with recording(run_skipped) as skips:
        assert replacing_briefly(n) is None
    assert [skip["code"] for skip in skips] == ["not_replaced"]
    reason, _, _, _ = running.join()
    # Its signal said so; it went on regardless (renewals stopped: its lease lapsed).
    assert isinstance(reason, PreemptedError)


def test_replace_under_permits_stops_the_oldest_holder(store: str) -> None:
    n = name()
    oldest = Holder(replacing_permits, n, 30.0)
    newest = Holder(replacing_permits, n, 30.0)
    reason, token, _, _ = ran(replacing_permits(n))
    old_reason, old_token, _, _ = oldest.join()
    assert isinstance(old_reason, PreemptedError)
    assert newest.thread.is_alive(), "the newer holder keeps its permit"
    key = f"conflicts:permits-replace:{n}"
    mine = locks.acquire(key, permits=2)  # the replacing run released its permit
    assert mine is not None
    assert locks.acquire(key, permits=2) is None  # the newer holder holds the other
    mine.release()
    locks.store.force_release(key)
    newest_reason, newest_token, _, _ = newest.join()
    assert isinstance(newest_reason, LockLostError)
    assert not isinstance(newest_reason, PreemptedError)
    assert reason is None and token > newest_token > old_token


# retry, outside a task framework


def test_retry_outside_a_task_raises_improperly_configured_at_the_first_conflict() -> None:
    n = name()
    assert retrying(n) == 1  # no conflict: it just runs
    held = locks.acquire(f"conflicts:retry:{n}")
    assert held is not None
    with pytest.raises(ImproperlyConfigured, match=r"does not run as a Celery task") as raised:
        retrying(n)
    held.release()
    assert "on_conflict='skip' or 'raise'" in str(raised.value)
    assert ".delay()" in str(raised.value)


# Coroutines


def test_async_skip_raise_and_wait(store: str) -> None:
    n = name()
    held = [locks.acquire(f"conflicts:async-{what}:{n}") for what in ("skip", "raise", "wait")]

    async def main() -> None:
        with recording(run_skipped) as skips:
            assert await askipping(n) is None
        assert [skip["code"] for skip in skips] == ["in_progress"]
        with pytest.raises(LockNotAcquiredError) as raised:
            await araising(n)
        assert raised.value.wait == pytest.approx(0.2)
        wait_lock = held[2]
        assert wait_lock is not None
        # The event loop keeps running while the run waits: the release comes from it.
        asyncio.get_running_loop().call_later(0.3, wait_lock.release)
        began = time.monotonic()
        ran_at = await awaiting(n)
        assert ran_at is not None and ran_at - began >= 0.25

    asyncio.run(main())
    for lock in held[:2]:
        assert lock is not None
        lock.release()


def test_async_replace(store: str) -> None:
    n = name()
    started = threading.Event()
    outcome: list[Any] = []

    def holder() -> None:
        outcome.append(asyncio.run(areplacing(n, 30.0, started=started)))

    thread = threading.Thread(target=holder)
    thread.start()
    assert started.wait(10)
    reason, token, _, _ = ran(asyncio.run(areplacing(n)))
    thread.join(20)
    old_reason, old_token, _, _ = outcome[0]
    assert isinstance(old_reason, PreemptedError)
    assert reason is None and token > old_token


def test_async_retry_outside_a_task_raises_improperly_configured() -> None:
    n = name()
    held = locks.acquire(f"conflicts:async-retry:{n}")
    assert held is not None
    with pytest.raises(ImproperlyConfigured, match="on_conflict='retry'"):
        asyncio.run(aretrying(n))
    held.release()


# Management commands, in this process


def command(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_a_command_with_raise_fails_naming_the_holder(store: str) -> None:
    held = locks.acquire("raising:report")
    assert held is not None
    with pytest.raises(CommandError, match="'raising:report' is held by") as raised:
        command("raising_report")
    assert isinstance(raised.value.__cause__, LockNotAcquiredError)
    held.release()
    assert command("raising_report")[0].startswith("ran with token")


def test_a_command_with_wait_runs_once_the_holder_lets_go(store: str) -> None:
    held = locks.acquire("waiting:report")
    assert held is not None
    threading.Timer(0.3, held.release).start()
    out, err = command("waiting_report")
    assert out.startswith("ran with token") and err == ""


def test_a_command_with_replace_stops_the_running_one(store: str, tmp_path: Any) -> None:
    out = str(tmp_path / "runs")
    results: list[tuple[str, str]] = []
    running = threading.Thread(
        target=lambda: results.append(command("replacing_report", "--out", out, "--hold", "30"))
    )
    running.start()
    eventually(lambda: (tmp_path / "runs.started").exists(), what="the first run holds the key")
    printed, _ = command("replacing_report", "--out", out)
    running.join(20)
    assert results[0][0].endswith("PreemptedError\n"), results
    assert printed.endswith("finished\n"), printed
    first, second = (line.split() for line in (tmp_path / "runs").read_text().splitlines())
    assert (first[2], second[2]) == ("PreemptedError", "finished")
    assert int(second[1]) > int(first[1])


def test_a_command_whose_running_one_never_stops_is_not_replaced(store: str) -> None:
    held = locks.acquire("replacing:report", ttl="60s")
    assert held is not None
    with recording(run_skipped) as skips:
        out, err = command("replacing_report")
    held.release()
    assert out == ""
    assert err.startswith(
        f"Skipped replacing_report (key 'replacing:report'): {NOT_REPLACED} (held by "
    ), err
    assert [skip["code"] for skip in skips] == ["not_replaced"]


# Refused at decoration


def test_retry_is_refused_for_a_management_command() -> None:
    import types

    module = types.ModuleType("tests.testapp.management.commands.retrying_report")
    code = (
        "from django_locks import without_overlapping\n"
        "class Command:\n"
        "    @without_overlapping('retrying:report', on_conflict='retry')\n"
        "    def handle(self, *args, **options): ...\n"
    )
    with pytest.raises(ValueError, match=r"`on_conflict` 'retry' is for task runs.*command"):
        exec(compile(code, "retrying_report.py", "exec"), module.__dict__)


class NoPreemptStore(InMemoryStore):
    """A store without preempt requests."""

    supports_preempt = False


NO_PREEMPT = {"BACKEND": "tests.test_conflicts.NoPreemptStore", "ALLOW_IN_MEMORY_STORAGE": True}


def test_replace_is_refused_at_decoration_for_a_store_without_preempt(settings: Any) -> None:
    settings.LOCKS = NO_PREEMPT
    with pytest.raises(ImproperlyConfigured, match="tests.test_conflicts.NoPreemptStore"):
        without_overlapping("conflicts:refused", on_conflict="replace")
    with pytest.raises(ImproperlyConfigured, match="supports_preempt is False"):
        limit_concurrency("conflicts:refused", permits=2, on_conflict="replace")
    without_overlapping("conflicts:refused", on_conflict="skip")  # the others are fine


def test_replace_is_refused_at_the_first_run_on_a_store_without_preempt(settings: Any) -> None:
    # Decorated while the store offered preempt requests (settings not read yet, say): the
    # first run refuses, before any store call.
    settings.LOCKS = NO_PREEMPT
    calls: list[str] = []
    store = locks.store
    store.acquire_as = lambda *args, **kwargs: calls.append("acquire_as")  # type: ignore[method-assign]
    with pytest.raises(ImproperlyConfigured, match="needs a store offering preempt requests"):
        replacing(name())
    assert calls == []


def test_replace_defers_the_check_while_settings_are_not_configured(monkeypatch: Any) -> None:
    from django.conf import settings

    monkeypatch.setattr(type(settings), "configured", property(lambda self: False))
    read: list[str] = []
    monkeypatch.setattr("django_locks.conf.get", lambda: read.append("read"))
    without_overlapping("conflicts:unconfigured", on_conflict="replace")
    assert read == []


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({"on_conflict": "ignore"}, ValueError, r"`on_conflict` must be one of 'skip', 'raise'"),
        ({"on_conflict": None}, TypeError, "`on_conflict` must be one of"),
        ({"wait": "5x"}, ValueError, "`wait` must be"),
        ({"wait": -1}, ValueError, "`wait` must be a non-negative duration"),
        ({"wait": "367d"}, ValueError, "at most 366 days"),
        ({"wait": True}, TypeError, "`wait`"),
        ({"max_retries": -1}, ValueError, "`max_retries` must be an int from 0 to 1000"),
        ({"max_retries": 1001}, ValueError, "`max_retries`"),
        ({"max_retries": True}, TypeError, "`max_retries`"),
        ({"max_retries": 1.5}, TypeError, "`max_retries`"),
        ({"max_hold": "10ms"}, ValueError, "`max_hold` must be None or a positive duration"),
        ({"max_hold": float("nan")}, ValueError, "`max_hold`"),
        ({"max_hold": False}, TypeError, "`max_hold`"),
        ({"ttl": "5x"}, ValueError, "`ttl`"),
    ],
)
def test_bad_arguments_are_refused_at_decoration(
    arguments: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        without_overlapping("conflicts:bad", **arguments)
    with pytest.raises(error, match=match):
        limit_concurrency("conflicts:bad", permits=2, **arguments)


def test_shared_key_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="`shared_key` must be True or False"):
        without_overlapping("conflicts:bad", shared_key="yes")  # type: ignore[call-overload]


def test_the_arguments_are_kept_on_the_job() -> None:
    from django_locks.decorators import job_spec

    spec = job_spec(replacing_briefly)
    assert spec is not None and spec.run is not None
    run = spec.run
    assert (run.on_conflict, run.wait_ms, run.ttl_ms, run.max_retries) == ("replace", 1000, 3000, 3)
    spec = job_spec(raising_permits)
    assert spec is not None and spec.run is not None
    assert (spec.run.on_conflict, spec.run.permits, spec.run.wait_ms) == ("raise", 2, None)


# max_hold, passed through to the run lock


@without_overlapping("conflicts:max-hold:{n}", ttl="1s", max_hold="300ms")
def capped(n: str) -> Any:
    lock = current_lock()
    assert lock is not None
    lock.signal.wait(10)
    return lock.signal.reason


def test_max_hold_stops_renewing_the_run_lock_and_aborts_its_signal(store: str) -> None:
    began = time.monotonic()
    reason = capped(name())
    assert isinstance(reason, LockLostError) and reason.detected_by == "max_hold"
    assert 0.25 < time.monotonic() - began < 5


def test_the_run_lock_takes_the_services_max_hold_by_default(settings: Any) -> None:
    settings.LOCKS = {**settings.LOCKS, "MAX_HOLD": "300ms"}
    held: list[Any] = []

    @without_overlapping("conflicts:default-max-hold", ttl="1s")
    def uncapped() -> None:
        lock = current_lock()
        assert lock is not None
        lock.signal.wait(10)
        held.append(lock.signal.reason)

    try:
        uncapped()
    finally:
        registry.unclaim(registry.job_for(uncapped, kind="job", key="conflicts:default-max-hold"))
    assert isinstance(held[0], LockLostError) and held[0].detected_by == "max_hold"


def test_an_owner_lease_takes_its_own_max_hold_never_the_services(settings: Any) -> None:
    from django_locks import on_one_instance
    from django_locks.ownership import sticky

    settings.LOCKS = {**settings.LOCKS, "MAX_HOLD": "200ms"}
    key = f"conflicts:owned:{name()}"

    @on_one_instance(key, ttl="1s")
    def uncapped() -> str:
        return "ran"

    @on_one_instance(f"{key}:capped", ttl="1s", max_hold="300ms")
    def capped_owner() -> str:
        return "ran"

    try:
        assert uncapped() == "ran" and capped_owner() == "ran"
        owner, capped_lease = sticky.held(f"{key}:owner"), sticky.held(f"{key}:capped:owner")
        assert owner is not None and capped_lease is not None
        time.sleep(0.6)
        assert owner.held, "an owner lease never takes LOCKS['MAX_HOLD']"
        assert not capped_lease.held
        reason = capped_lease.signal.reason
        assert isinstance(reason, LockLostError) and reason.detected_by == "max_hold"
        # Left to lapse within its ttl, then taken again by the next call (here or elsewhere).
        eventually(lambda: capped_owner() == "ran", what="the owner lease taken again")
        again = sticky.held(f"{key}:capped:owner")
        assert again is not None and again.fencing_token > capped_lease.fencing_token
    finally:
        release_owner_leases()
        unclaim(uncapped, capped_owner)


# Jobs that share a lock on purpose


def unclaim(*jobs: Any) -> None:
    for job in jobs:
        registry.unclaim(registry.job_for(job, kind="job", key=""))


def test_jobs_sharing_a_key_on_purpose_run_one_at_a_time() -> None:
    key = f"conflicts:crm:{name()}"

    @without_overlapping(key, shared_key=True)
    def crm_import() -> str:
        return "import"

    @without_overlapping(key, shared_key=True, on_conflict="raise")
    def crm_export() -> str:
        return "export"

    try:
        assert registry.claimed()[key].name.endswith("crm_import")
        assert (crm_import(), crm_export()) == ("import", "export")
        held = locks.acquire(key)
        assert held is not None
        with recording(run_skipped) as skips:
            assert crm_import() is None
        with pytest.raises(LockNotAcquiredError):
            crm_export()
        held.release()
        assert [skip["key"] for skip in skips] == [key]
    finally:
        unclaim(crm_import, crm_export)


def test_a_duplicate_key_without_shared_key_is_still_refused_naming_both() -> None:
    key = f"conflicts:crm:{name()}"

    @without_overlapping(key, shared_key=True)
    def sharing() -> None: ...

    other = f"conflicts:crm:{name()}"

    @without_overlapping(other)
    def owning() -> None: ...

    try:
        with pytest.raises(ImproperlyConfigured, match="sharing") as refused:

            @without_overlapping(key)
            def not_sharing() -> None: ...

        assert "not_sharing" in str(refused.value)
        assert "every one of them sets shared_key=True" in str(refused.value)
        with pytest.raises(ImproperlyConfigured, match="owning") as refused:

            @without_overlapping(other, shared_key=True)
            def late_sharer() -> None: ...

        assert "late_sharer" in str(refused.value)
        with pytest.raises(ImproperlyConfigured, match="sharing"):

            @on_one_instance(key)
            def owner_lease_on_it() -> None: ...

    finally:
        unclaim(sharing, owning)


def test_a_shared_key_stays_claimed_while_one_job_shares_it() -> None:
    key = f"conflicts:crm:{name()}"

    @without_overlapping(key, shared_key=True)
    def first() -> None: ...

    @without_overlapping(key, shared_key=True)
    def second() -> None: ...

    try:
        unclaim(first)
        assert registry.claimed()[key].name.endswith("second")
        with pytest.raises(ImproperlyConfigured, match="second"):

            @without_overlapping(key)
            def third() -> None: ...

    finally:
        unclaim(first, second)
    assert key not in registry.claimed()


def test_shared_key_is_not_the_owner_lease_of_a_stacked_on_one_instance() -> None:
    key = f"conflicts:crm:{name()}"
    with pytest.raises(ImproperlyConfigured, match="Give @on_one_instance a key of its own"):

        @on_one_instance()
        @without_overlapping(key, shared_key=True)
        def stacked() -> None: ...

    @on_one_instance(key + "-import")
    @without_overlapping(key, shared_key=True)
    def stacked_apart() -> str:
        lock = current_lock()
        assert lock is not None
        return lock.key

    try:
        assert stacked_apart() == key
    finally:
        unclaim(stacked_apart)
        release_owner_leases()


def test_the_errors_pickle_with_their_facts() -> None:
    """Celery's prefork pool and result backends pickle the error a task failed with."""
    import pickle

    from django_locks.holders import this_process

    refused = LockNotAcquiredError("conflicts:k", 0.5, this_process(), 2)
    preempted = PreemptedError("conflicts:k", 7)
    for error in (refused, preempted, LockLostError("conflicts:k", 7, "max_hold")):
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error)
        assert str(again) == str(error) and again.__dict__ == error.__dict__
    assert pickle.loads(pickle.dumps(refused)).holder == refused.holder


def test_retry_of_a_task_called_directly_raises_lock_not_acquired() -> None:
    """Outside a worker, Celery's retry() raises the error it was given: so does the task."""
    celery = pytest.importorskip("celery")
    app = celery.Celery("conflicts", set_as_current=False)
    n = name()

    @app.task(name="conflicts.direct")  # type: ignore[untyped-decorator]
    @without_overlapping("conflicts:direct:{n}", on_conflict="retry")
    def direct(n: str) -> int:
        return 1

    try:
        assert direct(n) == 1
        held = locks.acquire(f"conflicts:direct:{n}")
        assert held is not None
        with pytest.raises(LockNotAcquiredError, match=f"'conflicts:direct:{n}' is held by"):
            direct(n)
        held.release()
    finally:
        unclaim(direct.run)
