"""Every signal has one sender, the ``Locks`` class, whoever sends it (the service, a subclass of
it, ``run_leader``'s campaign, the beat hook): a receiver connected with ``sender=Locks`` hears
them all."""

from __future__ import annotations

import threading
import types
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from django.dispatch import Signal
from django.test import override_settings

from django_locks import Lock, Locks, leader_election
from django_locks.contrib.celery import BeatGuard
from django_locks.leader import Campaign, _elections
from django_locks.registry import job_for, unclaim
from django_locks.signals import leadership_acquired, leadership_lost, lock_lost
from django_locks.stores import InMemoryStore
from django_locks.testing import ManualClock
from tests.helpers import eventually


@pytest.fixture
def heard() -> Iterator[list[tuple[Signal, dict[str, Any]]]]:
    """What receivers connected with ``sender=Locks`` (only) hear."""
    received: list[tuple[Signal, dict[str, Any]]] = []
    receivers = []
    for signal in (lock_lost, leadership_acquired, leadership_lost):

        def receiver(sender: Any, signal: Signal, **kwargs: Any) -> None:
            assert sender is Locks
            received.append((signal, kwargs))

        signal.connect(receiver, sender=Locks, weak=False)
        receivers.append((signal, receiver))
    yield received
    for signal, receiver in receivers:
        signal.disconnect(receiver, sender=Locks)


def test_a_subclass_of_locks_sends_with_the_locks_class(heard) -> None:
    class MyLocks(Locks):
        pass

    clock = ManualClock()
    store = InMemoryStore(clock=clock)
    service = MyLocks(store, ttl="1s", clock=ManualClock())  # its holder pauses
    lock = service.acquire("sender:subclass")
    assert lock is not None
    clock.advance("2s")
    assert store.acquire("sender:subclass", "another-owner", 1000) is not None
    service.clock.advance("1s")  # type: ignore[attr-defined]
    assert [(signal, kwargs["key"]) for signal, kwargs in heard] == [(lock_lost, "sender:subclass")]


def test_run_leaders_campaign_sends_with_the_locks_class(heard) -> None:
    def work(lock: Lock) -> None:
        lock.signal.wait()

    leader_election("sender:campaign")(work)
    try:
        stopping = threading.Event()
        campaign = Campaign(
            _elections["sender:campaign"],
            Locks(InMemoryStore(), ttl=1),
            ttl_ms=1000,
            grace=2.0,
            stopping=stopping,
        )
        thread = threading.Thread(target=campaign.run)
        thread.start()
        eventually(lambda: len(heard) == 1, what="leading")
        stopping.set()
        campaign.wake.set()
        thread.join(10)
        eventually(lambda: len(heard) == 2, what="stepping down")
    finally:
        _elections.pop("sender:campaign", None)
        unclaim(job_for(work, kind="", key="sender:campaign"))
    assert [signal for signal, _ in heard] == [leadership_acquired, leadership_lost]


@override_settings(
    LOCKS={
        "BACKEND": "django_locks.stores.InMemoryStore",
        "ALLOW_IN_MEMORY_STORAGE": True,
        "CELERY_BEAT_LEADER": True,
    }
)
def test_the_beat_hook_sends_with_the_locks_class(heard) -> None:
    app = Celery("sender-tests", set_as_current=False)
    scheduler = types.SimpleNamespace(app=app, apply_entry=lambda *a: None, close=lambda: None)
    guard = BeatGuard(scheduler)
    assert guard.lead()
    guard.close()
    eventually(lambda: len(heard) >= 2, what="the beat's leadership, then its hand-back")
    assert [signal for signal, _ in heard] == [leadership_acquired, leadership_lost]
    assert heard[1][1]["reason"] == "released"
