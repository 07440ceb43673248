"""leader_election and the campaign, in one process with threads (run_leader processes: see
test_run_leader.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command

from django_locks import Lock, Locks, current_lock, registry
from django_locks.leader import Campaign, Election, _elections, leader_election
from django_locks.signals import leadership_acquired, leadership_lost
from django_locks.stores import InMemoryStore
from tests.helpers import eventually, recording

TTL_MS = 600


@pytest.fixture
def store() -> InMemoryStore:
    return InMemoryStore()


@pytest.fixture
def elections() -> Iterator[list[Election]]:
    """Elections defined by a test, forgotten afterwards."""
    made: list[Election] = []
    yield made
    for election in made:
        _elections.pop(election.key, None)
        registry.unclaim(registry.job_for(election.target, kind="", key=election.key))


def elect(elections: list[Election], key: str, target: Any) -> Election:
    leader_election(key)(target)
    election = _elections[key]
    elections.append(election)
    return election


class Replica:
    """One campaign on its own Locks (as one run_leader process would be), on a thread."""

    def __init__(self, election: Election, store: InMemoryStore) -> None:
        self.stopping = threading.Event()
        self.lines: list[str] = []
        self.campaign = Campaign(
            election,
            Locks(store, ttl=TTL_MS / 1000),
            ttl_ms=TTL_MS,
            grace=2.0,
            stopping=self.stopping,
            report=lambda line, level: self.lines.append(line),
        )
        self.thread = threading.Thread(target=self.campaign.run)
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.campaign.wake.set()
        self.thread.join(10)
        assert not self.thread.is_alive()


@pytest.fixture
def replicas(store: InMemoryStore) -> Iterator[Any]:
    started: list[Replica] = []

    def start(election: Election) -> Replica:
        replica = Replica(election, store)
        started.append(replica)
        return replica

    yield start
    for replica in started:
        if replica.thread.is_alive():
            replica.stop()


def test_one_of_three_leads_and_a_release_hands_over_at_once(elections, replicas) -> None:
    running: list[tuple[int, Lock]] = []
    guard = threading.Lock()
    overlaps = []

    def work(lock: Lock) -> None:
        assert current_lock() is lock
        with guard:
            running.append((threading.get_ident(), lock))
            if sum(1 for _, other in running if other.held) > 1:
                overlaps.append(lock.fencing_token)
        lock.signal.wait()

    election = elect(elections, "leader:feed", work)
    with recording(leadership_acquired) as acquired, recording(leadership_lost) as lost:
        group = [replicas(election) for _ in range(3)]
        eventually(lambda: len(running) == 1, what="one leader")
        time.sleep(TTL_MS / 1000 * 2)  # renewals keep it; followers keep campaigning
        assert len(running) == 1
        leader = next(r for r in group if any(line.startswith("Leading") for line in r.lines))
        started = time.monotonic()
        leader.stop()
        eventually(lambda: len(running) == 2, what="a follower takes over")
        handover = time.monotonic() - started
    assert handover < TTL_MS / 1000 / 3, f"handover took {handover:.3f}s: not woken by the release"
    assert overlaps == []
    assert running[1][1].fencing_token > running[0][1].fencing_token
    assert [a["key"] for a in acquired] == ["leader:feed", "leader:feed"]
    assert lost[0]["reason"] == "released"
    assert lost[0]["fencing_token"] == running[0][1].fencing_token
    assert any(line.startswith("Stepped down from leader:feed") for line in leader.lines)


def test_work_that_returns_or_raises_steps_down_and_campaigns_again(
    elections, replicas, caplog
) -> None:
    terms: list[int] = []

    def work(lock: Lock) -> None:
        terms.append(lock.fencing_token)
        if len(terms) == 1:
            raise RuntimeError("feed broke")

    replica = replicas(elect(elections, "leader:flaky", work))
    eventually(lambda: len(terms) >= 3, what="three terms")
    replica.stop()
    assert terms == sorted(set(terms))
    assert "feed broke" in caplog.text and "Traceback" in caplog.text


def test_a_class_keeps_leading_after_on_leadership_acquired_returns(
    elections, replicas, store
) -> None:
    events: list[tuple[str, int, str | None]] = []

    class Feed:
        def on_leadership_acquired(self, lock: Lock) -> None:
            events.append(("acquired", lock.fencing_token, None))

        def on_leadership_lost(self, lock: Lock, reason: str) -> None:
            events.append(("lost", lock.fencing_token, reason))

    replica = replicas(elect(elections, "leader:class", Feed))
    eventually(lambda: len(events) == 1, what="leading")
    time.sleep(TTL_MS / 1000 * 2)
    assert len(events) == 1  # returning did not step down
    assert store.leases()[0].key == "leader:class"
    # An operator frees the key; the next renewal is refused: the leader lost it.
    store.force_release("leader:class")
    eventually(lambda: ("lost", events[0][1], "lost") in events, what="on_leadership_lost")
    eventually(lambda: len([e for e in events if e[0] == "acquired"]) == 2, what="leads again")
    replica.stop()
    assert events[-1][0] == "lost" and events[-1][2] == "released"
    assert events[2][1] > events[0][1]


def test_shutdown_aborts_the_signal_and_reports_work_that_overstays_the_grace(
    elections, store
) -> None:
    def stubborn(lock: Lock) -> None:
        time.sleep(3)

    election = elect(elections, "leader:stubborn", stubborn)
    stopping = threading.Event()
    campaign = Campaign(election, Locks(store, ttl=1), ttl_ms=1000, grace=0.2, stopping=stopping)
    thread = threading.Thread(target=campaign.run)
    thread.start()
    eventually(lambda: store.leases() != [], what="leading")
    stopping.set()
    campaign.wake.set()
    thread.join(10)
    assert campaign.finished_in_time is False
    assert store.leases() == []  # released at once anyway


def test_duplicate_keys_are_refused_naming_both(elections) -> None:
    def first(lock: Lock) -> None: ...

    def second(lock: Lock) -> None: ...

    elect(elections, "leader:dup", first)
    with pytest.raises(ImproperlyConfigured, match="already used by leader_election"):
        leader_election("leader:dup")(second)
    leader_election("leader:dup")(first)  # the same function again is not a duplicate


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="`key`"):
        leader_election("")
    with pytest.raises(ValueError, match="`ttl`"):
        leader_election("k", ttl="5x")
    with pytest.raises(TypeError, match="on_leadership_acquired"):
        leader_election("leader:no-method")(type("NoMethod", (), {}))


def test_run_leader_lists_and_refuses_unknown_keys(elections, capsys) -> None:
    def work(lock: Lock) -> None: ...

    elect(elections, "leader:listed", work)
    call_command("run_leader", "--list")
    assert "leader:listed" in capsys.readouterr().out
    with pytest.raises(CommandError, match="No @leader_election registered for 'nope'"):
        call_command("run_leader", "nope")
    with pytest.raises(CommandError, match="at least one KEY"):
        call_command("run_leader")
    with pytest.raises(CommandError, match="`--grace` must be"):
        call_command("run_leader", "leader:listed", "--grace", "soon")


def test_a_term_ends_at_max_hold_with_reason_max_hold_and_the_campaign_goes_on(
    elections, replicas, store: InMemoryStore
) -> None:
    terms: list[Lock] = []

    def work(lock: Lock) -> None:
        terms.append(lock)
        lock.signal.wait()  # works until told: at max_hold

    leader_election("leader:capped", max_hold="300ms")(work)
    election = _elections["leader:capped"]
    elections.append(election)
    assert election.max_hold_ms == 300
    with recording(leadership_lost) as lost:
        replica = replicas(election)
        eventually(lambda: len(terms) >= 2, what="a second term after max_hold", timeout=10)
        replica.stop()
    first = terms[0]
    reason = first.signal.reason
    assert getattr(reason, "detected_by", None) == "max_hold"
    assert lost[0]["reason"] == "max_hold"
    assert terms[1].fencing_token > first.fencing_token
    assert any("reached its max_hold" in line for line in replica.lines)


def test_an_election_never_takes_the_services_max_hold(elections, store: InMemoryStore) -> None:
    terms: list[Lock] = []

    def work(lock: Lock) -> None:
        terms.append(lock)
        lock.signal.wait()

    election = elect(elections, "leader:uncapped", work)
    stopping = threading.Event()
    campaign = Campaign(
        election,
        Locks(store, ttl=TTL_MS / 1000, max_hold="100ms"),
        ttl_ms=TTL_MS,
        grace=2.0,
        stopping=stopping,
    )
    thread = threading.Thread(target=campaign.run)
    thread.start()
    try:
        eventually(lambda: len(terms) == 1, what="a term")
        time.sleep(0.5)
        assert terms[0].held and len(terms) == 1
    finally:
        stopping.set()
        campaign.wake.set()
        thread.join(10)


def test_a_bad_max_hold_is_refused_at_decoration() -> None:
    with pytest.raises(ValueError, match="max_hold"):
        leader_election("leader:bad", max_hold="1ms")
