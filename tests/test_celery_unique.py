"""Celery's enqueue-time uniqueness (``django_locks.contrib.celery_unique``), fast: no server.

Each test builds its own Celery app on kombu's in-memory transport (a real broker in this process:
``apply_async`` publishes, nothing runs) and the test settings' in-memory lock store; the real
broker and worker are in test_celery_unique_worker.py. Here: the options checked at the decorator,
the decorator's order, the key a call takes whatever form it is given in (hypothesis), arguments
JSON cannot encode, the message (task id chosen first, the header, nothing secret), a publish that
fails, an eager run.
"""

# mypy: disable-error-code="untyped-decorator"

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery, shared_task
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_locks import AlreadyQueuedError, current_lock
from django_locks.contrib.celery import HEADER_UNIQUE, UniqueTask, unique
from django_locks.testing import reset_locks
from django_locks.unique import owner_for
from tests.strategies import JSON

pytestmark = pytest.mark.usefixtures("locks_reset")


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery(f"unique{uuid.uuid4().hex[:6]}", broker="memory://", set_as_current=False)
    app.conf.task_ignore_result = True
    app.finalize()
    queued(app)  # kombu's memory transport is one per process: left empty by no one else
    yield app
    reset_locks()


def queued(app: Celery) -> list[Any]:
    """Every message in the default queue (taken out of it)."""
    messages = []
    with app.connection_for_write() as conn:
        queue = conn.SimpleQueue("celery")
        while queue.qsize():
            messages.append(queue.get(timeout=1))
        queue.close()
    return messages


def report(customer_id: int, month: str = "2026-11", *, pages: list[int] | None = None) -> None:
    """A task body."""


def bound_report(
    self: Any, customer_id: int, month: str = "2026-11", *, pages: list[int] | None = None
) -> None:
    """A bound task body (bind=True): ``self`` is not an argument of the call."""


# The options, checked at the decorator.


@pytest.mark.parametrize(
    ("options", "error", "rule"),
    [
        ("1h", TypeError, "`unique` must be a dict of key, until, ttl"),
        ({"ttl": "1h", "timeout": 3}, TypeError, "`unique` takes key, until, ttl; unknown 'tim"),
        ({}, TypeError, "`ttl` is required"),
        ({"ttl": "0s"}, ValueError, "ttl"),
        ({"ttl": "1h", "until": "done"}, ValueError, "`until` must be 'started' or 'finished'"),
        ({"ttl": "1h", "key": "r:{nope}"}, ValueError, "names 'nope'"),
        ({"ttl": "1h", "key": 5}, TypeError, "`key` must be a str"),
    ],
)
def test_bad_unique_task_options_fail_at_the_decorator(
    app: Celery, options: Any, error: type[Exception], rule: str
) -> None:
    with pytest.raises(error, match=rule):
        app.task(shared=False, base=UniqueTask, unique=options)(report)
    with pytest.raises(error, match=rule):
        app.task(shared=False, base=UniqueTask, unique=options, bind=True, name="b")(bound_report)
    assert "b" not in app.tasks


def test_unique_task_without_options_is_refused(app: Celery) -> None:
    with pytest.raises(TypeError, match=r"base=UniqueTask needs the option unique=\{'ttl'"):
        app.task(shared=False, base=UniqueTask)(report)


def test_a_class_based_unique_task_and_an_abstract_base(app: Celery) -> None:
    class Base(UniqueTask):
        unique = {"ttl": "1h", "key": "r:{customer_id}"}

    task = app.task(shared=False, base=Base, name="from-base")(report)
    task.delay(3)
    with pytest.raises(AlreadyQueuedError, match="r:3"):
        task.delay(customer_id=3)
    with pytest.raises(ValueError, match="names 'customer_id'"):

        class Wrong(UniqueTask):
            unique = {"ttl": "1h", "key": "r:{customer_id}"}

            def run(self, other: int) -> None:
                pass


@pytest.mark.parametrize(
    ("options", "error", "rule"),
    [
        ({}, TypeError, "`ttl` is required"),
        ({"ttl": "1h", "until": "queued"}, ValueError, "`until` must be"),
        ({"ttl": "1h", "key": "r:{nope}"}, ValueError, "names 'nope'"),
    ],
)
@pytest.mark.parametrize("form", ["app.task", "app.task-lazy", "shared_task"])
def test_bad_unique_options_fail_at_the_decorator(
    form: str, options: dict[str, Any], error: type[Exception], rule: str
) -> None:
    """Above a task of a finalized app, an app's lazy proxy, or shared_task's proxy."""
    app = Celery(f"u{uuid.uuid4().hex[:6]}", broker="memory://", set_as_current=False)
    if form == "app.task":
        app.finalize()
    name = f"bad-{uuid.uuid4().hex[:6]}"
    if form == "shared_task":
        task = shared_task(name=name, bind=True)(bound_report)
    else:
        task = app.task(shared=False, name=name, bind=True)(bound_report)
    with pytest.raises(error, match=rule):
        unique(**options)(task)


def test_unique_below_the_task_decorator_is_a_type_error_naming_the_order() -> None:
    with pytest.raises(TypeError, match=r"unique\(\.\.\.\) goes above the task decorator"):
        shared_task(unique(ttl="1h")(report))


def test_unique_on_a_unique_task_is_refused(app: Celery) -> None:
    task = app.task(shared=False, base=UniqueTask, unique={"ttl": "1h"}, name="twice")(report)
    with pytest.raises(TypeError, match="a UniqueTask already"):
        unique(ttl="1h")(task)


# The key: one per call, whatever form the call is given in.


Form = Callable[[Any, int, Any], Any]
FORMS: list[Form] = [
    lambda t, c, p: t.delay(c, "2026-11", pages=p),
    lambda t, c, p: t.delay(customer_id=c, pages=p),
    lambda t, c, p: t.apply_async(kwargs={"pages": p, "month": "2026-11", "customer_id": c}),
    lambda t, c, p: t.apply_async((c,), {"pages": p}),
    lambda t, c, p: t.s(c, pages=json.loads(json.dumps(p))).apply_async(),
]


@pytest.fixture(params=["UniqueTask", "unique", "UniqueTask-bound", "unique-bound"])
def make_task(request: pytest.FixtureRequest, app: Celery) -> Callable[[], Any]:
    def make() -> Any:
        name = f"t{uuid.uuid4().hex[:10]}"
        bound = request.param.endswith("-bound")
        body = bound_report if bound else report
        if request.param.startswith("UniqueTask"):
            options = {"base": UniqueTask, "unique": {"ttl": "1h"}}
            return app.task(shared=False, name=name, bind=bound, **options)(body)
        return unique(ttl="1h")(app.task(shared=False, name=name, bind=bound)(body))

    return make


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(customer=st.integers(), pages=JSON, first=st.sampled_from(range(len(FORMS))))
def test_every_form_of_one_call_is_one_key_and_a_second_enqueue_is_refused(
    app: Celery, make_task: Callable[[], Any], customer: int, pages: Any, first: int
) -> None:
    """Positional or keyword, defaults given or left out, keywords in any order, a signature:
    one queued message; another argument is another key."""
    queued(app)  # kombu's memory transport is one per process: empty it for this example
    task = make_task()
    FORMS[first](task, customer, pages)
    for form in FORMS:
        with pytest.raises(AlreadyQueuedError) as refused:
            form(task, customer, pages)
        assert refused.value.task == task.name
    FORMS[first](task, customer + 1, pages)
    messages = queued(app)
    assert len(messages) == 2
    keys = [m.headers[HEADER_UNIQUE]["key"] for m in messages]
    assert keys[0] != keys[1] and all(k.startswith(task.name + ":") for k in keys)


NOT_JSON = [object(), {1, 2}, b"bytes", math.nan, math.inf, {(1, 2): "tuple key"}, uuid.uuid4()]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=st.sampled_from(NOT_JSON), inside=st.booleans(), customer=st.integers())
def test_arguments_json_cannot_encode_are_a_type_error_and_nothing_is_published(
    app: Celery, make_task: Callable[[], Any], value: Any, inside: bool, customer: int
) -> None:
    queued(app)
    task = make_task()
    pages = [1, {"x": value}] if inside else value
    with pytest.raises(TypeError, match="argument 'pages' cannot be part of a unique key"):
        task.delay(customer, pages=pages)
    assert queued(app) == []
    task.delay(customer, pages=[1])  # nothing was claimed either
    assert len(queued(app)) == 1


# The message.


def test_the_message_carries_the_key_and_until_and_nothing_secret(app: Celery) -> None:
    task = app.task(
        base=UniqueTask, unique={"ttl": "1h", "key": "r:{customer_id}", "until": "started"}
    )(report)
    result = task.apply_async((7,), task_id="chosen-id", headers={"mine": 1})
    assert result.id == "chosen-id"
    (message,) = queued(app)
    assert message.headers["id"] == "chosen-id"
    assert message.headers[HEADER_UNIQUE] == {"key": "r:7", "until": "started"}
    assert message.headers["mine"] == 1  # the caller's headers are kept
    assert owner_for("chosen-id") not in json.dumps(message.headers) + message.body.decode()
    other = task.delay(8)
    assert uuid.UUID(other.id).version == 4  # chosen before publishing
    with pytest.raises(AlreadyQueuedError, match=r"'r:7' \(enqueued by .*chosen-id"):
        task.delay(7)


def test_a_publish_that_fails_gives_the_key_back(app: Celery) -> None:
    task = unique("r:{customer_id}", ttl="1h")(app.task(shared=False, name="fails")(report))
    with pytest.raises(Exception, match="No such transport|Connection refused|refused"):
        task.apply_async((1,), connection=Celery(broker="redis://127.0.0.1:1/0").connection())
    assert queued(app) == []
    task.delay(1)  # the key was given back
    assert len(queued(app)) == 1


def test_send_task_by_name_bypasses_the_claim(app: Celery) -> None:
    task = unique("r:{customer_id}", ttl="1h")(app.task(shared=False, name="by-name")(report))
    task.delay(1)
    app.send_task("by-name", args=[1])
    messages = queued(app)
    assert [HEADER_UNIQUE in m.headers for m in messages] == [True, False]


def test_an_eager_run_runs_under_the_lease_and_frees_it(app: Celery) -> None:
    app.conf.task_always_eager = True
    seen: list[Any] = []

    @unique("eager:{n}", ttl="1h")
    @app.task(shared=False, name="eager")
    def eager(n: int) -> int:
        lock = current_lock()
        seen.append(lock.key if lock is not None else None)
        return n * 2

    assert eager.delay(4).get() == 8
    assert eager.delay(4).get() == 8  # finished: the key is free again
    assert seen == ["eager:4", "eager:4"]
    assert eager(5) == 10 and seen[-1] is None  # a direct call is not a message: no lease
