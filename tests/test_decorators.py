"""on_one_instance and without_overlapping on functions, coroutines and commands, in one process.

The configured service (tests/settings.py) is the in-memory store; another instance is played by
taking the lease directly. Processes on a shared store are in test_commands_decorated.py and
test_celery*.py.
"""

from __future__ import annotations

import asyncio
import inspect
import io
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command

from django_locks import current_lock, locks, on_one_instance, registry, without_overlapping
from django_locks.decorators import ELSEWHERE, IN_PROGRESS, job_spec, release_owner_leases
from django_locks.exceptions import LockLostError
from django_locks.signals import run_skipped
from tests.helpers import eventually, recording

pytestmark = pytest.mark.usefixtures("locks_reset", "no_sticky_leases")


@pytest.fixture
def no_sticky_leases() -> Iterator[None]:
    release_owner_leases()
    yield
    release_owner_leases()


calls: list[Any] = []


@on_one_instance(ttl="1s")
def nightly(x: int, *, y: int = 2) -> int:
    """Nightly docs."""
    calls.append(("nightly", current_lock()))
    return x + y


@without_overlapping(ttl="1s")
def exclusive() -> int | None:
    lock = current_lock()
    assert lock is not None
    return lock.fencing_token


@on_one_instance(key="both:sync", ttl="1s")
@without_overlapping()
def both_owner_first() -> Any:
    return current_lock()


@without_overlapping()
@on_one_instance(key="both:reverse", ttl="1s")
def both_run_first() -> Any:
    return current_lock()


@without_overlapping("report:{customer_id}")
def report(customer_id: int) -> Any:
    return current_lock()


@on_one_instance
def bare() -> str:
    return "ran"


@on_one_instance("async:job", ttl="1s")
@without_overlapping()
async def async_job(value: int) -> tuple[int, Any]:
    await asyncio.sleep(0)
    return value, current_lock()


def test_signature_name_and_docs_are_kept() -> None:
    assert nightly.__name__ == "nightly"
    assert nightly.__doc__ == "Nightly docs."
    assert str(inspect.signature(nightly)) == "(x: 'int', *, y: 'int' = 2) -> 'int'"
    assert inspect.iscoroutinefunction(async_job)
    assert bare() == "ran"


def test_default_keys_are_module_dot_function() -> None:
    spec = job_spec(nightly)
    assert spec is not None
    assert spec.owner_template() == "tests.test_decorators.nightly"
    assert "tests.test_decorators.nightly:owner" in registry.claimed()


def test_a_sticky_owner_lease_costs_no_round_trip_once_held(monkeypatch: Any) -> None:
    store_calls: list[str] = []
    real_acquire = locks.store.acquire_as

    def counting(*args: Any, **kwargs: Any) -> Any:
        store_calls.append(args[0])
        return real_acquire(*args, **kwargs)

    monkeypatch.setattr(locks.store, "acquire_as", counting)
    calls.clear()
    assert nightly(1) == 3
    assert nightly(2, y=5) == 7
    assert store_calls == ["tests.test_decorators.nightly:owner"]
    owner = calls[0][1]
    assert owner.key == "tests.test_decorators.nightly:owner"
    assert calls[1][1] is owner  # the same sticky lease, kept between calls


def test_another_instance_owning_the_job_skips_it(caplog: Any) -> None:
    other = locks.acquire("tests.test_decorators.nightly:owner")
    assert other is not None
    caplog.set_level(logging.DEBUG, logger="django_locks")
    with recording(run_skipped) as skips:
        assert nightly(1) is None
    assert skips == [
        {"key": "tests.test_decorators.nightly:owner", "reason": ELSEWHERE, "code": "elsewhere"}
    ]
    assert (
        "Skipped tests.test_decorators.nightly (key 'tests.test_decorators.nightly:owner'): it "
        "runs on another instance"
    ) in caplog.text
    other.release()
    assert nightly(1) == 3
    assert "tests.test_decorators.nightly runs on this instance (lease" in caplog.text


def test_a_lost_owner_lease_is_taken_again_or_skipped() -> None:
    calls.clear()
    nightly(1)
    owner = calls[-1][1]
    locks.store.force_release(owner.key)
    eventually(lambda: not owner.held, timeout=5, what="the renewal noticed the loss")
    thief = locks.acquire(owner.key)
    assert nightly(1) is None
    assert thief is not None
    thief.release()
    assert nightly(1) == 3
    assert calls[-1][1] is not owner


def test_the_run_lock_is_current_and_its_token_grows() -> None:
    first, second = exclusive(), exclusive()
    assert first is not None and second is not None
    assert second > first
    assert current_lock() is None


def test_a_held_run_lock_skips_the_run(caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="django_locks")
    held = locks.acquire("tests.test_decorators.exclusive")
    assert held is not None
    with recording(run_skipped) as skips:
        assert exclusive() is None
    assert skips == [
        {"key": "tests.test_decorators.exclusive", "reason": IN_PROGRESS, "code": "in_progress"}
    ]
    assert (
        "Skipped tests.test_decorators.exclusive (key 'tests.test_decorators.exclusive'): a run "
        "is still in progress (held by "
    ) in caplog.text
    held.release()


def test_a_raising_run_releases_its_lock() -> None:
    @without_overlapping("raising:job")
    def raising() -> None:
        raise ValueError("boom")

    try:
        with pytest.raises(ValueError):
            raising()
        assert locks.acquire("raising:job") is not None
    finally:
        registry.unclaim(registry.job_for(raising, kind="job", key="raising:job"))


@pytest.mark.parametrize("job", [both_owner_first, both_run_first])
def test_stacked_in_either_order_one_key_owner_first_then_run_lock(job: Any) -> None:
    key = job_spec(job).owner_template()  # type: ignore[union-attr]
    run = job()
    assert run.key == key  # the key given to one decorator is the key of both
    release_owner_leases()
    other = locks.acquire(key + ":owner")
    assert other is not None
    run_lock = locks.acquire(key)
    assert run_lock is not None
    with recording(run_skipped) as skips:
        assert job() is None
    # The owner lease is checked first: the run lock (held here) is never looked at.
    assert skips == [{"key": key + ":owner", "reason": ELSEWHERE, "code": "elsewhere"}]
    run_lock.release()
    other.release()


def test_the_run_signal_aborts_when_the_owner_lease_is_lost() -> None:
    seen: list[BaseException | None] = []

    @on_one_instance("linked:job", ttl="300ms")
    @without_overlapping(ttl="5s")
    def linked() -> None:
        lock = current_lock()
        assert lock is not None and lock.key == "linked:job"
        locks.store.force_release("linked:job:owner")
        lock.signal.wait(5)
        seen.append(lock.signal.reason)

    try:
        linked()
    finally:
        registry.unclaim(registry.job_for(linked, kind="job", key="linked:job"))
    assert isinstance(seen[0], LockLostError)
    assert seen[0].key == "linked:job:owner"


def test_key_templates_take_different_locks_per_argument() -> None:
    assert report(1).key == "report:1"
    held = locks.acquire("report:1")
    assert held is not None
    assert report(1) is None
    assert report(2).key == "report:2"
    held.release()


def test_a_template_naming_an_unknown_argument_is_refused_at_decoration() -> None:
    with pytest.raises(ValueError, match="customer"):

        @without_overlapping("report:{customer}")
        def bad(customer_id: int) -> None: ...


def test_bad_arguments_are_refused_before_any_io() -> None:
    with pytest.raises(ValueError, match="ttl"):
        on_one_instance(ttl="5x")
    with pytest.raises(TypeError, match="key"):
        without_overlapping(key=5)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="owner"):
        on_one_instance("k" * 495)
    with pytest.raises(TypeError, match="twice"):
        without_overlapping()(exclusive)


def test_two_different_jobs_on_one_key_are_refused_naming_both() -> None:
    with pytest.raises(ImproperlyConfigured, match="nightly"):

        @without_overlapping("tests.test_decorators.nightly:owner")
        def clash() -> None: ...

    with pytest.raises(ImproperlyConfigured, match="exclusive"):

        @on_one_instance("tests.test_decorators.exclusive")
        def clash2() -> None: ...


def test_the_same_function_decorated_again_is_not_a_duplicate() -> None:
    spec = job_spec(exclusive)
    assert spec is not None
    without_overlapping()(spec.func)  # as when its module is imported twice


def test_async_jobs_hold_both_locks_and_skip() -> None:
    ran = asyncio.run(async_job(4))
    assert ran is not None
    value, lock = ran
    assert value == 4 and lock.key == "async:job"
    held = locks.acquire("async:job")
    assert held is not None
    assert asyncio.run(async_job(5)) is None
    held.release()


def test_threads_calling_a_sticky_job_share_the_lease() -> None:
    results: list[int | None] = []
    threads = [threading.Thread(target=lambda: results.append(nightly(1))) for _ in range(4)]
    nightly(0)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [3, 3, 3, 3]


# Management commands, in this process (three processes: test_commands_decorated.py).


def run_command(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_a_command_keeps_its_lease_for_min_hold_then_runs_again() -> None:
    out, err = run_command("locked_report")
    assert out.startswith("ran with token") and err == ""
    out, err = run_command("locked_report")
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith(
        "Skipped locked_report (key 'locked_report:owner'): it runs on another instance (held by "
    )
    assert ", its hold ends in " in err
    # min_hold is 3 s after the run's start, then the next tick runs.
    eventually(lambda: run_command("locked_report")[0] != "", timeout=10, what="ran again")


def test_a_command_that_raises_releases_at_once() -> None:
    with pytest.raises(RuntimeError):
        run_command("locked_report", "--fail")
    out, _ = run_command("locked_report")
    assert out.startswith("ran with token")


def test_a_command_with_both_decorators_and_a_template_key() -> None:
    from tests.testapp.management.commands.locked_import import Command

    Command.runs.clear()
    run_command("locked_import", "a")
    run_command("locked_import", "b")
    run_command("locked_import", "a")
    assert [key for key, _ in Command.runs] == ["import:a", "import:b", "import:a"]
    assert Command.runs[2][1] > Command.runs[0][1]
    held = locks.acquire("import:a")
    assert held is not None
    _, err = run_command("locked_import", "a")
    assert err.startswith(
        "Skipped locked_import (key 'import:a'): a run is still in progress (held by "
    )
    held.release()
    # The skipped run handed its owner lease back at once.
    assert locks.acquire("import:a:owner") is not None


def test_a_skipped_command_whose_owner_hand_back_fails_still_skips(monkeypatch: Any) -> None:
    """The run lock held elsewhere, and the store failing the owner lease's hand-back: the
    skip is still a skip (the line on stderr, no error), the lease lapses at its ttl."""
    from django_locks.exceptions import StoreError

    held = locks.acquire("import:c")
    assert held is not None
    real_end = locks.store.end

    def failing(key: str, owner: str, how: str, **kwargs: Any) -> bool:
        if key.endswith(":owner"):
            raise StoreError("release: store unreachable (injected)")
        return real_end(key, owner, how, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(locks.store, "end", failing)
    _, err = run_command("locked_import", "c")
    assert err.startswith(
        "Skipped locked_import (key 'import:c'): a run is still in progress (held by "
    )
    monkeypatch.undo()
    held.release()
