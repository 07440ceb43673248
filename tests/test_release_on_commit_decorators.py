"""``release="on_commit"`` on ``without_overlapping`` and ``limit_concurrency``: the run lock of a
run that ends inside ``transaction.atomic()`` is held until the commit, released at once by a
rollback; a coroutine function is refused at decoration; bad values are refused naming the
argument. The configured service runs on the PostgreSQL ``DatabaseStore``; a competitor in
another thread asks the store through a connection of its own."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import transaction
from django.db.transaction import TransactionManagementError
from django.test import override_settings

from django_locks import current_lock, limit_concurrency, locks, without_overlapping
from tests.helpers import competitor_gets

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "postgres"]),
]


class Boom(Exception):
    pass


@pytest.fixture(autouse=True)
def postgres_service(postgres_server: Any) -> Iterator[None]:
    config = {"BACKEND": "django_locks.stores.DatabaseStore", "OPTIONS": {"using": "postgres"}}
    with override_settings(LOCKS=config):
        yield


def free(key: str) -> bool:
    """Whether a competitor in another thread gets ``key`` now (released again at once)."""
    return competitor_gets(locks, key)


def name() -> str:
    return f"oncommit-job:{uuid.uuid4().hex[:10]}"


def test_the_run_lock_is_held_until_the_commit() -> None:
    key = name()
    seen: list[Any] = []

    @without_overlapping(key, release="on_commit")
    def job() -> str:
        seen.append(current_lock())
        return "done"

    with transaction.atomic(using="postgres"):
        assert job() == "done"
        (lock,) = seen
        assert lock.held and not free(key)
    assert not lock.held and free(key)


def test_a_run_that_raises_is_released_at_the_rollback() -> None:
    key = name()
    seen: list[Any] = []

    @without_overlapping(key, release="on_commit", on_conflict="raise")
    def job() -> None:
        seen.append(current_lock())
        raise Boom

    with transaction.atomic(using="postgres"):
        with pytest.raises(Boom), transaction.atomic(using="postgres"):
            job()
        assert seen[0]._keeper.state == "released" and free(key)


def test_limit_concurrency_keeps_its_permit_until_the_commit_on_using() -> None:
    key = name()
    seen: list[Any] = []

    @limit_concurrency(key, permits=2, release="on_commit", using="default")
    def job() -> None:
        seen.append(current_lock())

    with transaction.atomic(using="default"):
        job()
        assert seen[0].held
    assert seen[0]._keeper.state == "released"


def test_on_exit_releases_as_the_run_ends_inside_the_transaction() -> None:
    key = name()

    @without_overlapping(key)
    def job() -> None:
        pass

    with transaction.atomic(using="postgres"):
        job()
        assert free(key)


def test_a_run_inside_transactions_on_several_aliases_is_refused_before_the_acquire() -> None:
    key = name()
    ran: list[bool] = []

    @without_overlapping(key, release="on_commit")
    def job() -> None:
        ran.append(True)

    with transaction.atomic(using="postgres"), transaction.atomic(using="default"):
        with pytest.raises(TransactionManagementError, match="release='on_commit'"):
            job()
    assert ran == [] and locks.store.lease(key) is None


def test_a_coroutine_function_is_refused_at_decoration() -> None:
    async def job() -> None:
        pass

    for decorator in (
        without_overlapping(name(), release="on_commit"),
        limit_concurrency(name(), permits=3, release="on_commit"),
    ):
        with pytest.raises(TypeError, match="cannot decorate the coroutine function"):
            decorator(job)
    without_overlapping(name())(job)  # release="on_exit": fine


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"release": "on_rollback"}, "`release` must be"),
        ({"release": None}, "`release` must be"),
        ({"release": "on_commit", "using": "elsewhere"}, "`using` must be an alias"),
        ({"release": "on_commit", "using": 3}, "`using` must be an alias"),
        ({"using": "postgres"}, "`using`.*leave it None"),
    ],
)
def test_bad_values_are_refused_at_decoration_naming_the_argument(
    kwargs: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        without_overlapping(name(), **kwargs)
    with pytest.raises(ValueError, match=named):
        limit_concurrency(name(), permits=2, **kwargs)
