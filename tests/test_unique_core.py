"""The enqueue-time lease shared by Celery's and django.tasks' uniqueness (``django_locks.unique``,
SPEC section 14), below both front ends: the canonical key, the derived owner id, the claim at
enqueue, the run's take-over and the lapsed-lease cases, on the in-memory store, PostgreSQL and
Redis (the configured service, ``LOCKS`` set per test).

The front ends, with real brokers and workers, are in test_celery_unique*.py and
test_tasks_unique*.py.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_locks import AlreadyQueuedError, Lock
from django_locks.signals import run_skipped
from django_locks.testing import reset_locks
from django_locks.unique import UniqueSpec, arguments_json, claim, owner_for, take_over, unique_spec
from django_locks.unique import unclaim as give_back
from tests.helpers import SERVICE_STORES, configure_service, recording
from tests.strategies import JSON

pytestmark = pytest.mark.usefixtures("locks_reset")


def report(customer_id: int, month: str = "2026-11", *, pages: list[int] | None = None) -> None:
    """A task body: the signature the keys bind to."""


def spec(ttl: Any = "1h", until: Any = "finished", key: Any = None) -> UniqueSpec:
    return unique_spec(report, "shop.tasks.report", key=key, until=until, ttl=ttl)


# The key: canonical JSON of the bound arguments, defaults applied.


def test_positional_keyword_and_default_calls_are_one_key() -> None:
    s = spec()
    keys = {
        s.key((42,), {}),
        s.key((42, "2026-11"), {}),
        s.key((), {"customer_id": 42}),
        s.key((), {"month": "2026-11", "customer_id": 42, "pages": None}),
    }
    assert len(keys) == 1
    (key,) = keys
    assert key.startswith("shop.tasks.report:") and len(key) == len("shop.tasks.report:") + 64
    assert s.key((43,), {}) != key
    assert s.key((42,), {"month": "2026-12"}) != key


def takes_anything(*args: Any, **kwargs: Any) -> None:
    """A body taking any arguments."""


@settings(max_examples=200, deadline=None)
@given(st.lists(JSON, max_size=4), st.dictionaries(st.text(min_size=1), JSON, max_size=4))
def test_the_key_survives_a_json_round_trip_and_keyword_order(
    args: list[Any], kwargs: dict[str, Any]
) -> None:
    """What a broker or a task database does to the arguments (tuples become lists, a dict's
    order is lost) does not change the key; neither does the order keywords are given in."""
    s = unique_spec(takes_anything, "t", key=None, until="finished", ttl="1m")
    key = s.key(tuple(args), kwargs)
    travelled = json.loads(json.dumps([args, kwargs]))
    assert s.key(tuple(travelled[0]), travelled[1]) == key
    assert s.key(tuple(args), dict(reversed(list(kwargs.items())))) == key


@pytest.mark.parametrize(
    "value",
    [object(), {1, 2}, b"bytes", math.nan, math.inf, {(1, 2): "tuple key"}, uuid.uuid4()],
    ids=["object", "set", "bytes", "nan", "inf", "tuple-key", "uuid"],
)
def test_arguments_json_cannot_encode_are_a_type_error_naming_the_argument(value: Any) -> None:
    with pytest.raises(TypeError, match="argument 'customer_id' cannot be part of a unique key"):
        spec().key((value,), {})


def test_arguments_the_signature_does_not_take_are_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"do not fit report\(\)"):
        arguments_json(report, (1, "m", "extra"), {})


def test_a_template_key_is_rendered_from_the_arguments() -> None:
    s = spec(key="report:{customer_id}:{month}")
    assert s.key((7,), {}) == "report:7:2026-11"
    assert s.key((object(),), {}).startswith("report:<object")  # a template needs no JSON


@pytest.mark.parametrize(
    ("options", "error", "rule"),
    [
        ({"ttl": None}, TypeError, "`ttl` is required"),
        ({"ttl": "0s"}, ValueError, "ttl"),
        ({"ttl": True}, TypeError, "ttl"),
        ({"until": "done"}, ValueError, "`until` must be 'started' or 'finished'"),
        ({"until": 1}, TypeError, "`until` must be"),
        ({"key": "r:{nope}"}, ValueError, "names 'nope'"),
        ({"key": 5}, TypeError, "`key` must be a str"),
        ({"key": ""}, ValueError, "key"),
    ],
)
def test_bad_options_are_refused_naming_the_rule(
    options: dict[str, Any], error: type[Exception], rule: str
) -> None:
    with pytest.raises(error, match=rule):
        spec(**options)


# The owner id: derived, never in the message.


def test_the_owner_id_is_an_hmac_of_the_message_id(settings: Any) -> None:
    owner = owner_for("9f1c-task-id")
    assert owner == owner_for("9f1c-task-id")
    assert owner != owner_for("9f1c-task-iD")
    assert "9f1c" not in owner and len(owner) == 64
    settings.SECRET_KEY = "another secret"
    assert owner_for("9f1c-task-id") != owner


# Claim and take-over, on each store.


@pytest.fixture(params=SERVICE_STORES)
def store(request: pytest.FixtureRequest, settings: Any) -> Iterator[str]:
    configure_service(request, settings, "unique")
    yield request.param
    reset_locks()


def key_of(s: UniqueSpec) -> str:
    return s.key((uuid.uuid4().int % 10**9,), {})


def test_a_second_message_of_a_claimed_key_is_refused_naming_the_first(store: str) -> None:
    s = spec()
    key = key_of(s)
    first = claim(s, key, "task-A")
    with pytest.raises(AlreadyQueuedError) as refused:
        claim(s, key, "task-B")
    assert refused.value.key == key and refused.value.task == "shop.tasks.report"
    assert refused.value.holder is not None and refused.value.holder.detail == "task-A"
    assert "task-A" in str(refused.value)
    assert claim(s, key, "task-A") == first  # the same message again: idempotent, same token


def test_the_run_takes_the_lease_over_with_its_token_and_holds_it_until_released(
    store: str,
) -> None:
    s = spec()
    key = key_of(s)
    token = claim(s, key, "task-A")
    lock = take_over(s, key, "task-A", "task-A")
    assert isinstance(lock, Lock) and lock.fencing_token == token
    with pytest.raises(AlreadyQueuedError):
        claim(s, key, "task-B")  # until="finished": running still holds the key
    lock.release()
    assert claim(s, key, "task-B") > token


def test_until_started_gives_the_key_back_when_the_run_starts(store: str) -> None:
    s = spec(until="started")
    key = key_of(s)
    claim(s, key, "task-A")
    assert take_over(s, key, "task-A", "task-A") is True
    claim(s, key, "task-B")  # accepted while A runs


def test_a_run_whose_lease_lapsed_takes_the_free_key(store: str) -> None:
    s = spec(ttl="50ms")
    key = key_of(s)
    token = claim(s, key, "task-A")
    time.sleep(0.2)
    lock = take_over(s, key, "task-A", "task-A")
    assert isinstance(lock, Lock) and lock.fencing_token > token
    lock.release()


@pytest.mark.parametrize("until", ["finished", "started"])
def test_a_run_whose_lease_lapsed_while_another_enqueue_holds_it_is_a_logged_duplicate(
    store: str, until: str, caplog: pytest.LogCaptureFixture
) -> None:
    s = spec(ttl="50ms", until=until)
    later = spec(ttl="1h", until=until)
    key = key_of(s)
    claim(s, key, "task-A")
    time.sleep(0.2)
    claim(later, key, "task-B")
    with recording(run_skipped) as skips, caplog.at_level(logging.WARNING, "django_locks"):
        assert take_over(s, key, "task-A", "result-A") is False
    assert [skip["code"] for skip in skips] == ["duplicate"]
    warning = next(r for r in caplog.records if r.levelno == logging.WARNING)
    assert "result-A" in warning.getMessage() and "task-B" in warning.getMessage()
    # B still holds the key, and runs.
    lock = take_over(later, key, "task-B", "task-B")
    assert isinstance(lock, Lock) or lock is True


def test_a_failed_publish_gives_the_key_back(store: str) -> None:
    s = spec()
    key = key_of(s)
    claim(s, key, "task-A")
    give_back(key, "task-A")
    claim(s, key, "task-B")
