"""django.tasks' uniqueness at enqueue time, fast (no worker): enqueue_unique / try_enqueue_unique
on the dummy backend (queued, never run) and the immediate one (run inside the enqueue), the
default key over odd arguments (hypothesis), the refusals. The db_worker runs are in
tests/test_tasks_unique_workers.py."""

# mypy: disable-error-code="untyped-decorator"

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_locks.exceptions import AlreadyQueuedError
from django_locks.stores import InMemoryStore
from tests.strategies import JSON

pytestmark = [pytest.mark.tasks, pytest.mark.usefixtures("locks_reset")]


class _Tasks:
    """tests/children/tasks_unique_tasks.py, imported at first use: collecting this module must
    not need django.tasks (the ``tasks`` marker skips its tests without it)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(importlib.import_module("tests.children.tasks_unique_tasks"), name)


tasks = _Tasks()


class CountingStore(InMemoryStore):
    """The in-memory store, recording every call of the store interface (each is one round
    trip on a server store)."""

    calls: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        value = super().__getattribute__(name)
        if name in _INTERFACE and callable(value):

            def counted(*args: Any, **kwargs: Any) -> Any:
                CountingStore.calls.append(name)
                return value(*args, **kwargs)

            return counted
        return value


_INTERFACE = frozenset(
    name
    for name in dir(InMemoryStore)
    if not name.startswith("_") and callable(getattr(InMemoryStore, name))
) - {"close", "capabilities", "warp", "supports"}


class FailingBackend:
    """Filled in by the fixture below: the dummy backend whose enqueue fails."""


@pytest.fixture
def unique() -> Iterator[Any]:
    """The module's API, imported here: the tasks marker skips the module without django.tasks."""
    from django_locks.contrib import tasks_unique

    tasks.RUNS.clear()
    yield tasks_unique
    tasks.RUNS.clear()


def dummy(task: Any) -> Any:
    return task.using(backend="dummy")


def immediate(task: Any) -> Any:
    return task.using(backend="immediate")


# What enqueue_unique does.


def test_a_second_enqueue_of_the_same_arguments_is_refused_until_the_first_runs(
    unique: Any,
) -> None:
    first = unique.enqueue_unique(dummy(tasks.sleep_for), ("a",), ttl="1h")
    assert first.status == "READY"
    with pytest.raises(AlreadyQueuedError) as refused:
        unique.enqueue_unique(dummy(tasks.sleep_for), ("a",), {"pause": 0.0}, ttl="1h")
    assert refused.value.task == "tests.children.tasks_unique_tasks.sleep_for"
    assert refused.value.key.startswith("tests.children.tasks_unique_tasks.sleep_for:")
    assert refused.value.holder is not None
    payload = first.kwargs[unique.PAYLOAD]
    assert refused.value.holder.detail == payload["nonce"]  # the queued message, named
    assert payload == {"nonce": payload["nonce"], "key": refused.value.key, "until": "finished"}
    assert unique.try_enqueue_unique(dummy(tasks.sleep_for), kwargs={"name": "a"}, ttl="1h") is None
    # Other arguments are another key.
    assert unique.try_enqueue_unique(dummy(tasks.sleep_for), ("b",), ttl="1h") is not None


def test_a_run_under_until_finished_holds_the_key_and_gives_it_back(unique: Any) -> None:
    unique.enqueue_unique(immediate(tasks.sleep_for), ("a",), ttl="1h")
    assert [run["event"] for run in tasks.RUNS] == ["start", "stop"]
    assert all(run["locked"] for run in tasks.RUNS)  # current_lock() is the run's lease
    # The run ended: the key is free again.
    assert unique.enqueue_unique(immediate(tasks.sleep_for), ("a",), ttl="1h").status == (
        "SUCCESSFUL"
    )


def test_until_started_gives_the_key_back_when_the_run_starts(unique: Any) -> None:
    # report's @unique_task(key="report:{customer_id}", until="started", ttl="1h").
    unique.enqueue_unique(immediate(tasks.report), (7,))
    assert [run["locked"] for run in tasks.RUNS] == [False, False]
    assert unique.enqueue_unique(dummy(tasks.report), (7,), {"pause": 1.0}).status == "READY"
    with pytest.raises(AlreadyQueuedError, match="'report:7'"):
        unique.enqueue_unique(dummy(tasks.report), (7,))
    # enqueue_unique's options win over unique_task's.
    assert unique.try_enqueue_unique(dummy(tasks.report), (7,), key="report-b:{customer_id}")


def test_a_plain_enqueue_and_a_direct_call_just_run(unique: Any) -> None:
    assert immediate(tasks.sleep_for).enqueue("plain").status == "SUCCESSFUL"
    assert tasks.sleep_for.func("direct") == "direct"
    assert [run["locked"] for run in tasks.RUNS] == [False] * 4


def test_an_async_task_function_runs_under_its_lease(unique: Any) -> None:
    unique.enqueue_unique(immediate(tasks.sleep_async), ("a",), ttl="1h")
    assert [(run["event"], run["locked"]) for run in tasks.RUNS] == [
        ("start", True),
        ("stop", True),
    ]


def test_an_enqueue_adds_one_store_round_trip(unique: Any) -> None:
    locks = {"BACKEND": f"{__name__}.CountingStore", "ALLOW_IN_MEMORY_STORAGE": True}
    with override_settings(LOCKS=locks):
        CountingStore.calls.clear()
        unique.enqueue_unique(dummy(tasks.sleep_for), ("a",), ttl="1h")
        assert CountingStore.calls == ["acquire_as"]
        CountingStore.calls.clear()
        assert unique.try_enqueue_unique(dummy(tasks.sleep_for), ("a",), ttl="1h") is None
        assert CountingStore.calls == ["acquire_as"]


def test_a_failing_backend_enqueue_gives_the_key_back(unique: Any) -> None:
    from django.conf import settings as django_settings

    failing = {"BACKEND": f"{__name__}.FailingBackend"}
    with override_settings(TASKS={**django_settings.TASKS, "failing": failing}):
        with pytest.raises(ConnectionError, match="broker down"):
            unique.enqueue_unique(tasks.sleep_for.using(backend="failing"), ("a",), ttl="1h")
    assert unique.enqueue_unique(dummy(tasks.sleep_for), ("a",), ttl="1h").status == "READY"


@pytest.fixture(autouse=True, scope="module")
def _failing_backend() -> None:
    from django_locks.contrib.tasks_compat import installed

    DummyBackend: Any = importlib.import_module(f"{installed()[0]}.backends.dummy").DummyBackend

    class Failing(DummyBackend):  # type: ignore[misc]
        def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
            raise ConnectionError("broker down")

    globals()["FailingBackend"] = Failing


# The refusals, before anything is written.


def test_a_task_without_unique_task_is_a_type_error_naming_the_fix(unique: Any) -> None:
    with pytest.raises(TypeError) as refused:
        unique.enqueue_unique(dummy(tasks.plain), (1,), ttl="1h")
    text = str(refused.value)
    assert "@task()\n    @unique_task\n    def plain(...)" in text
    assert "tests.children.tasks_unique_tasks.plain" in text
    with pytest.raises(TypeError, match="takes a django.tasks Task"):
        unique.enqueue_unique(tasks.sleep_for.func, ("a",), ttl="1h")


def test_unique_task_above_task_is_a_type_error_naming_the_order(unique: Any) -> None:
    with pytest.raises(TypeError) as refused:
        unique.unique_task(tasks.plain)
    assert "@unique_task is placed above @task() on tests.children.tasks_unique_tasks.plain" in (
        str(refused.value)
    )
    assert "@task()\n    @unique_task\n    def plain(...)" in str(refused.value)
    with pytest.raises(TypeError, match="above @task()"):
        unique.unique_task(ttl="1h")(tasks.plain)


def test_another_decorator_between_task_and_unique_task_is_refused(unique: Any) -> None:
    import functools

    inner = tasks.sleep_for.func

    @functools.wraps(inner)
    def between(*args: Any, **kwargs: Any) -> Any:
        return inner(*args, **kwargs)

    wrapped = dummy(tasks.sleep_for)
    object.__setattr__(wrapped, "func", between)  # what @task() over @other over @unique_task gives
    with pytest.raises(TypeError, match="not right under @task()"):
        unique.enqueue_unique(wrapped, ("a",), ttl="1h")


@pytest.mark.parametrize(
    ("options", "error", "rule"),
    [
        ({}, TypeError, "`ttl` is required"),
        ({"ttl": "1ms"}, ValueError, "ttl"),
        ({"ttl": "1h", "until": "sometimes"}, ValueError, "'started' or 'finished'"),
        ({"ttl": "1h", "until": 3}, TypeError, "'started' or 'finished'"),
        ({"ttl": "1h", "key": 3}, TypeError, "`key` must be a str"),
        ({"ttl": "1h", "key": "x:{nope}"}, ValueError, "nope"),
        ({"ttl": "1h", "key": ""}, ValueError, "key"),
    ],
)
def test_bad_options_name_the_rule_and_write_nothing(
    unique: Any, options: dict[str, Any], error: type[Exception], rule: str
) -> None:
    with pytest.raises(error, match=rule):
        unique.enqueue_unique(dummy(tasks.sleep_for), ("a",), **options)
    assert unique.enqueue_unique(dummy(tasks.sleep_for), ("a",), ttl="1h").status == "READY"


@pytest.mark.parametrize(
    ("args", "kwargs", "rule"),
    [
        ("a", None, "`args` must be a list or tuple"),
        ((), ["a"], "`kwargs` must be a mapping"),
        ((), {1: "a"}, "`kwargs` must be a mapping"),
        (("a",), {"_django_locks_unique": {}}, "adds it itself"),
        (("a", 1, 2), None, "do not fit"),
    ],
)
def test_bad_arguments_name_the_rule(unique: Any, args: Any, kwargs: Any, rule: str) -> None:
    with pytest.raises(TypeError, match=rule):
        unique.enqueue_unique(dummy(tasks.sleep_for), args, kwargs, ttl="1h")


def test_unique_task_options_are_checked_at_decoration(unique: Any) -> None:
    def job(n: int) -> None: ...

    with pytest.raises(ValueError, match="sometimes"):
        unique.unique_task(until="sometimes")(job)
    with pytest.raises(ValueError, match="ttl"):
        unique.unique_task(ttl="1ms")(job)
    with pytest.raises(ValueError, match="missing"):
        unique.unique_task(key="job:{missing}")(job)
    with pytest.raises(TypeError, match="decorates a function"):
        unique.unique_task(3)


def test_a_malformed_payload_is_refused_naming_it(unique: Any) -> None:
    with pytest.raises(ValueError, match="_django_locks_unique"):
        tasks.sleep_for.func("a", _django_locks_unique={"nonce": "n"})
    assert tasks.RUNS == []


# The default key over odd arguments.


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(name=JSON, pause=JSON, extra=st.dictionaries(st.text(min_size=1), JSON, max_size=3))
def test_one_call_is_one_key_however_its_arguments_are_passed(
    unique: Any, name: Any, pause: Any, extra: dict[str, Any]
) -> None:
    spec = unique_spec_of(unique, tasks.sleep_for)
    by_position = spec.key((name, pause), {})
    assert spec.key((), {"pause": pause, "name": name}) == by_position
    assert len(by_position) <= 500
    assert by_position.startswith("tests.children.tasks_unique_tasks.sleep_for:")
    if isinstance(pause, float) and str(pause) == "0.0":
        assert spec.key((name,), {}) == by_position  # the default applied
    else:  # 0 and -0.0 are other JSON than the default 0.0
        assert spec.key((name,), {}) != by_position
    assert spec.key((name, [pause]), {}) != by_position
    # Through a real enqueue: queued with the arguments as given, refused the second time.
    queued = unique.try_enqueue_unique(dummy(tasks.report), (1,), {**extra}, key=by_position)
    if queued is not None:
        assert unique.try_enqueue_unique(dummy(tasks.report), (2,), key=by_position) is None
        assert {k: v for k, v in queued.kwargs.items() if k != unique.PAYLOAD} == extra


ODD = st.sampled_from([b"bytes", {1, 2}, object(), float("nan"), float("inf"), 3j, [b"x"]])


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(odd=ODD, where=st.sampled_from(["name", "pause"]), templated=st.booleans())
def test_arguments_json_cannot_encode_are_a_type_error_before_anything_is_written(
    unique: Any, odd: Any, where: str, templated: bool
) -> None:
    from django_locks.testing import reset_locks

    reset_locks()
    options: dict[str, Any] = {"ttl": "1h"}
    if templated:
        options["key"] = "odd:fixed"
    with pytest.raises(TypeError, match=f"argument {where!r} cannot be part of a unique key"):
        unique.enqueue_unique(dummy(tasks.sleep_for), (), {"name": "n", where: odd}, **options)
    # Nothing was claimed: the same key is free.
    assert unique.try_enqueue_unique(dummy(tasks.sleep_for), (), {"name": "n"}, **options)


def unique_spec_of(unique: Any, task: Any) -> Any:
    from django_locks.unique import unique_spec

    return unique_spec(task.func, task.module_path, key=None, until="finished", ttl="1h")


def test_a_duplicate_run_is_skipped_with_a_warning_naming_both(
    unique: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The immediate backend's view of the worker side: a message whose lease lapsed while
    another holds the key (here: a queued one on the dummy backend) does not run."""
    from django_locks.unique import owner_for

    queued = unique.enqueue_unique(dummy(tasks.sleep_for), ("a",), ttl="1h")
    stale = queued.kwargs[unique.PAYLOAD]
    assert owner_for(stale["nonce"])
    late = {**stale, "nonce": "lapsed-message-nonce"}
    with caplog.at_level(logging.WARNING, logger="django_locks"):
        result = immediate(tasks.sleep_for).enqueue("a", _django_locks_unique=late)
    assert result.status == "SUCCESSFUL" and result.return_value is None
    assert tasks.RUNS == []
    [record] = [
        r for r in caplog.records if "duplicate" in r.getMessage() or "lapsed" in r.getMessage()
    ]
    assert record.levelno == logging.WARNING
    assert result.id in record.getMessage() and stale["nonce"] in record.getMessage()


def test_the_names_are_importable_from_contrib_tasks(unique: Any) -> None:
    from django_locks.contrib import tasks as seam

    names = ("enqueue_unique", "try_enqueue_unique", "unique_task")
    assert [getattr(seam, name) for name in names] == [getattr(unique, name) for name in names]


def test_a_task_taking_the_context_keys_its_other_arguments(unique: Any) -> None:
    ran = unique.enqueue_unique(immediate(tasks.with_context), ("a",))
    assert ran.return_value == ran.id
    assert [(run["result"], run["locked"]) for run in tasks.RUNS] == [(ran.id, True)] * 2
    queued = unique.enqueue_unique(dummy(tasks.with_context), kwargs={"name": "a"})
    with pytest.raises(AlreadyQueuedError):
        unique.enqueue_unique(dummy(tasks.with_context), ("a",))
    assert queued.kwargs[unique.PAYLOAD]["key"].startswith(tasks.with_context.module_path + ":")
