"""Bad input is a clear ValueError/TypeError naming the argument, and nothing is written."""

from __future__ import annotations

import datetime

import pytest

from django_locks import AbortSignal, Locks
from django_locks.durations import to_milliseconds
from django_locks.keys import check_template, render_key, validate_key
from django_locks.stores import InMemoryStore


@pytest.fixture
def store() -> InMemoryStore:
    return InMemoryStore()


@pytest.fixture
def service(store: InMemoryStore) -> Locks:
    return Locks(store)


BAD_KEYS = [
    ("", ValueError, "1 to 500 characters"),
    ("x" * 501, ValueError, "1 to 500 characters"),
    ("a\x00b", ValueError, "NUL"),
    ("lone \ud800 surrogate", ValueError, "surrogates"),
    (42, TypeError, "must be a str"),
    (b"bytes", TypeError, "must be a str"),
    (None, TypeError, "must be a str"),
]


@pytest.mark.parametrize(("key", "error", "rule"), BAD_KEYS)
def test_bad_keys_are_refused_before_anything_is_written(
    service: Locks, store: InMemoryStore, key, error, rule
) -> None:
    for call in (
        lambda: service.acquire(key),
        lambda: service.lock(key),
        lambda: service.with_lock(key, lambda: None),
    ):
        with pytest.raises(error, match=rule) as caught:
            call()
        assert "`key`" in str(caught.value)
    assert store.leases(include_inactive=True) == []


BAD_DURATIONS = [
    ("5x", ValueError),
    (0, ValueError),
    ("0s", ValueError),
    (-1, ValueError),
    ("-5s", ValueError),
    (datetime.timedelta(seconds=-3), ValueError),
    (float("nan"), ValueError),
    (float("inf"), ValueError),
    (True, TypeError),
    ([30], TypeError),
    (object(), TypeError),
]


@pytest.mark.parametrize(("ttl", "error"), BAD_DURATIONS)
def test_bad_ttls_are_refused_naming_the_argument(service, store, ttl, error) -> None:
    with pytest.raises(error, match="`ttl` must be a positive duration"):
        service.acquire("k", ttl=ttl)
    with pytest.raises(error, match="`ttl`"):
        Locks(store, ttl=ttl)
    assert store.leases(include_inactive=True) == []


def test_a_ttl_too_short_to_renew_is_refused(service, store) -> None:
    with pytest.raises(ValueError, match="`ttl` must be a positive duration of at least 50ms"):
        service.acquire("k", ttl="4ms")
    assert store.leases(include_inactive=True) == []


@pytest.mark.parametrize("wait", [-1, "-1s", "5x", "soon", datetime.timedelta(seconds=-1)])
def test_a_negative_or_unparsable_wait_is_refused(service, store, wait) -> None:
    with pytest.raises(ValueError, match="`wait` must be a non-negative duration"):
        service.acquire("k", wait=wait)
    assert store.leases(include_inactive=True) == []


def test_other_bad_arguments(service, store) -> None:
    with pytest.raises(TypeError, match="`signal` must be an AbortSignal"):
        service.acquire("k", signal="stop")
    with pytest.raises(TypeError, match="`fn` must be callable"):
        service.with_lock("k", 42)
    with pytest.raises(TypeError, match="`store` must be a LockStore"):
        Locks(object())  # type: ignore[arg-type]
    assert store.leases(include_inactive=True) == []
    assert service.acquire("k", signal=AbortSignal(), wait=0) is not None


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        ("500ms", 500),
        ("30s", 30_000),
        ("2m", 120_000),
        ("1h", 3_600_000),
        ("7d", 604_800_000),
        ("1.5s", 1500),
        (2, 2000),
        (0.25, 250),
        (datetime.timedelta(minutes=1), 60_000),
    ],
)
def test_durations(value, ms) -> None:
    assert to_milliseconds(value, name="ttl") == ms


def test_keys_are_kept_exactly() -> None:
    assert validate_key("Clé:🔒") == "Clé:🔒"
    assert validate_key("x" * 494, suffix=":owner") == "x" * 494 + ":owner"
    with pytest.raises(ValueError, match="once ':owner' is appended"):
        validate_key("x" * 495, suffix=":owner")


def test_key_templates_format_from_the_call_arguments() -> None:
    def report(customer_id: int, *, period: str = "daily") -> None: ...

    assert render_key("report:{customer_id}:{period}", report, (7,), {}) == "report:7:daily"
    assert render_key("plain", report, (7,), {}) == "plain"
    with pytest.raises(ValueError, match="names 'missing'"):
        check_template("report:{missing}", report)
    with pytest.raises(ValueError, match="must name the function's arguments"):
        check_template("report:{0}", report)
