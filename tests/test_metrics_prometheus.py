"""The Prometheus exporter (SPEC section 11) against the real prometheus-client: registries scraped
as text and parsed back, the multiprocess directory of two worker processes read back, the
exporter turned on by ``LOCKS["METRICS"]``, and nothing imported when it is off."""

from __future__ import annotations

import json
import queue
import re
import subprocess
import sys
import threading
import time
import typing
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    disable_created_metrics,
    enable_created_metrics,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.parser import text_string_to_metric_families

from django_locks import (
    Lock,
    Locks,
    events,
    exporters,
    leader_election,
    on_one_instance,
    without_overlapping,
)
from django_locks.abort import AbortSignal
from django_locks.contrib import prometheus
from django_locks.contrib.prometheus import FAMILIES, WAIT_BUCKETS, PrometheusExporter
from django_locks.contrib.prometheus_counts import CountsExporter
from django_locks.contrib.prometheus_multiprocess import MetricsExporter
from django_locks.events import Event
from django_locks.exceptions import StoreError
from django_locks.leader import Campaign, _elections
from django_locks.ownership import release_owner_leases
from django_locks.registry import job_for, unclaim
from django_locks.stores import InMemoryStore
from django_locks.testing import ManualClock
from tests.children.env import ROOT, child_env
from tests.helpers import FaultyStore, eventually

# Each metric as docs/topics/metrics.rst's table has it: its type and its labels.
METRICS = {
    "django_locks_acquire_wait_seconds": ("histogram", {"lock", "store", "outcome"}),
    "django_locks_acquisitions": ("counter", {"lock", "store", "outcome"}),
    "django_locks_held": ("gauge", {"lock", "store"}),
    "django_locks_lost": ("counter", {"lock", "store", "detected_by"}),
    "django_locks_renewal_seconds": ("histogram", {"store", "outcome"}),
    "django_locks_runs_skipped": ("counter", {"lock", "store", "code"}),
    "django_locks_leader": ("gauge", {"election", "store"}),
    "django_locks_owner_leases": ("gauge", {"lock", "store"}),
}
DOCS = Path(__file__).resolve().parent.parent / "docs" / "topics" / "metrics.rst"


class Scrape:
    """One scrape of a registry, as Prometheus reads it: the text format, parsed back."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.text = generate_latest(registry).decode()
        self.families = {f.name: f for f in text_string_to_metric_families(self.text)}
        self.samples = [s for family in self.families.values() for s in family.samples]

    def get(self, name: str, /, **labels: str) -> float | None:
        """The value of the sample ``name`` with exactly ``labels``, else None."""
        for sample in self.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
        return None

    def __call__(self, name: str, /, **labels: str) -> float:
        found = self.get(name, **labels)
        assert found is not None, f"no sample {name}{labels} in:\n{self.text}"
        return found

    def label_values(self, name: str, label: str) -> set[str]:
        return {s.labels[label] for s in self.samples if s.name == name and label in s.labels}


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    """A registry of the test's own, with an exporter on it subscribed to the event stream."""
    registry = CollectorRegistry()
    unsubscribe = events.subscribe(PrometheusExporter(registry).consume)
    yield registry
    unsubscribe()


def test_the_metrics_are_named_typed_and_labelled_as_documented(registry) -> None:
    service = Locks(InMemoryStore())
    lock = service.acquire("named:1")
    assert lock is not None
    lock.release()
    scrape = Scrape(registry)
    for name, (kind, labels) in METRICS.items():
        family = scrape.families[name]
        assert family.type == kind, name
        assert family.documentation, name
        for sample in family.samples:
            assert set(sample.labels) - {"le"} == labels, sample
    assert "# TYPE django_locks_acquisitions_total counter" in scrape.text
    table = DOCS.read_text()
    for name, (kind, labels) in METRICS.items():
        shown = name + "_total" if kind == "counter" else name
        row = re.search(rf"^\s*\* - ``{shown}``\n\s*- {kind}\n\s*- (.*)$", table, re.M)
        assert row is not None, f"{shown} ({kind}) not in the table of {DOCS}"
        assert set(re.findall(r"``(\w+)``", row[1])) == labels, shown


def test_acquisitions_by_outcome_and_their_waits(registry) -> None:
    store = InMemoryStore()
    service = Locks(store, ttl="10s")
    held = service.acquire("wait:1")
    assert held is not None
    assert service.acquire("wait:1") is None
    assert service.acquire("wait:1", wait="0.3s") is None  # waits, then stays taken
    aborted = AbortSignal()
    aborted.abort()
    assert service.acquire("wait:1", wait="5s", signal=aborted) is None
    broken = FaultyStore(InMemoryStore())  # a store that is down
    broken.failing.add("acquire")
    with pytest.raises(StoreError):
        Locks(broken).acquire("wait:2")
    held.release()
    scrape = Scrape(registry)
    name, down = str(store), str(broken)
    total = "django_locks_acquisitions_total"
    assert scrape(total, lock="wait", store=name, outcome="acquired") == 1
    assert scrape(total, lock="wait", store=name, outcome="taken") == 2
    assert scrape(total, lock="wait", store=name, outcome="aborted") == 1
    assert scrape(total, lock="wait", store=down, outcome="error") == 1
    wait = "django_locks_acquire_wait_seconds"
    taken = {"lock": "wait", "store": name, "outcome": "taken"}
    assert scrape(wait + "_count", **taken) == 2
    assert scrape(wait + "_bucket", le="0.25", **taken) == 1  # the acquire that did not wait
    assert scrape(wait + "_bucket", le="+Inf", **taken) == 2
    assert scrape(wait + "_sum", **taken) >= 0.3
    acquired = {"lock": "wait", "store": name, "outcome": "acquired"}
    assert scrape(wait + "_bucket", le="0.1", **acquired) == 1  # in-memory: no waiting
    assert scrape(wait + "_count", lock="wait", store=down, outcome="error") == 1


def test_the_held_gauge_goes_up_and_down(registry) -> None:
    service = Locks(InMemoryStore(), ttl="10s")
    name = str(service.store)
    first, second = service.acquire("held:1"), service.acquire("held:2")
    assert first is not None and second is not None
    assert Scrape(registry)("django_locks_held", lock="held", store=name) == 2
    first.release()
    assert Scrape(registry)("django_locks_held", lock="held", store=name) == 1
    with service.lock("held:3"):
        assert Scrape(registry)("django_locks_held", lock="held", store=name) == 2
    second.release()
    scrape = Scrape(registry)
    assert scrape("django_locks_held", lock="held", store=name) == 0
    assert (
        scrape("django_locks_acquisitions_total", lock="held", store=name, outcome="acquired") == 3
    )


def test_a_loss_is_counted_by_what_detected_it(registry) -> None:
    clock = ManualClock()
    store = InMemoryStore(clock=clock)
    holder_clock = ManualClock()  # the holder pauses: its renewals never run
    service = Locks(store, ttl="1s", clock=holder_clock)
    lock = service.acquire("paused:1")
    assert lock is not None
    clock.advance("2s")
    # The holder wakes 2 s later, past its deadline: its late renewal finds the lock lost.
    holder_clock.resume_after("2s")
    assert not lock.held
    scrape = Scrape(registry)
    labels = {"lock": "paused", "store": str(store)}
    assert scrape("django_locks_lost_total", detected_by="deadline", **labels) == 1
    assert scrape("django_locks_held", **labels) == 0
    assert not lock.release()  # no second decrement
    assert Scrape(registry)("django_locks_held", **labels) == 0


def test_renewal_round_trips_are_a_histogram_by_store_and_outcome(registry) -> None:
    clock = ManualClock()
    service = Locks(InMemoryStore(clock=clock), ttl="3s", clock=clock)
    locks = [service.acquire(f"renewed:{n}") for n in range(3)]
    clock.advance("1s")  # ttl / 3: the renewal round is due
    name = str(service.store)

    def renewed() -> float | None:
        return Scrape(registry).get(
            "django_locks_renewal_seconds_count", store=name, outcome="renewed"
        )

    eventually(lambda: renewed(), what="a renewal round in the histogram")
    scrape = Scrape(registry)
    assert scrape("django_locks_renewal_seconds_bucket", store=name, outcome="renewed", le="+Inf")
    assert scrape.label_values("django_locks_renewal_seconds_count", "outcome") == {"renewed"}
    for lock in locks:
        assert lock is not None
        lock.release()


def test_runs_skipped_by_code(registry, locks_reset) -> None:
    from django_locks import locks

    @without_overlapping("prom-skip:{n}", ttl="10s")
    def report(n: int) -> str:
        return "ran"

    other = locks.acquire("prom-skip:7")
    assert other is not None
    try:
        assert report(7) is None  # its run lock is held: skipped
        assert report(8) == "ran"
    finally:
        other.release()
    scrape = Scrape(registry)
    labels = {"lock": "prom-skip:{n}", "store": str(locks.store)}
    assert scrape("django_locks_runs_skipped_total", code="in_progress", **labels) == 1
    assert scrape("django_locks_acquisitions_total", outcome="taken", **labels) == 1
    assert scrape("django_locks_acquisitions_total", outcome="acquired", **labels) == 1


def test_owner_leases_and_an_owner_elsewhere(registry, locks_reset) -> None:
    from django_locks import locks

    @on_one_instance("prom-nightly", ttl="10s")
    def nightly() -> str:
        return "ran"

    store = str(locks.store)
    other = locks.acquire("prom-nightly:owner")  # another instance owns the job
    assert other is not None
    assert nightly() is None
    other.release()
    scrape = Scrape(registry)
    skipped = scrape(
        "django_locks_runs_skipped_total", lock="prom-nightly", store=store, code="elsewhere"
    )
    assert skipped == 1
    assert nightly() == "ran"
    leases = Scrape(registry).get("django_locks_owner_leases", lock="prom-nightly", store=store)
    assert leases == 1
    release_owner_leases()
    assert Scrape(registry)("django_locks_owner_leases", lock="prom-nightly", store=store) == 0


def test_the_leader_gauge_is_1_while_this_process_leads(registry) -> None:
    election = "prom-election"

    def work(lock: Lock) -> None:
        lock.signal.wait()

    leader_election(election)(work)
    service = Locks(InMemoryStore(), ttl=1)
    labels = {"election": election, "store": str(service.store)}
    stopping = threading.Event()
    campaign = Campaign(_elections[election], service, ttl_ms=1000, grace=2.0, stopping=stopping)
    thread = threading.Thread(target=campaign.run)
    try:
        thread.start()
        eventually(
            lambda: Scrape(registry).get("django_locks_leader", **labels) == 1, what="leading"
        )
        stopping.set()
        campaign.wake.set()
        thread.join(10)
        eventually(
            lambda: Scrape(registry).get("django_locks_leader", **labels) == 0,
            what="stepping down",
        )
    finally:
        stopping.set()
        _elections.pop(election, None)
        unclaim(job_for(work, kind="", key=election))
    assert Scrape(registry)("django_locks_held", lock=election, store=labels["store"]) == 0


def test_10000_keys_of_one_template_are_one_label_value(registry, locks_reset) -> None:
    from django_locks import locks

    @without_overlapping("prom-report:{n}", ttl="10s")
    def report(n: int) -> int:
        return n

    for n in range(10_000):
        report(n)
    scrape = Scrape(registry)
    for name in ("django_locks_acquisitions_total", "django_locks_held"):
        assert scrape.label_values(name, "lock") == {"prom-report:{n}"}, name
    labels = {"lock": "prom-report:{n}", "store": str(locks.store)}
    assert scrape("django_locks_acquisitions_total", outcome="acquired", **labels) == 10_000
    assert scrape("django_locks_held", **labels) == 0
    # The whole scrape stays small: series per label set, none per key.
    assert len(scrape.text.splitlines()) < 200


def masked(registry: CollectorRegistry) -> str:
    """The registry's scrape text with the value of each ``_created`` sample (a time) masked."""
    return CREATED.sub(r"\1 <time>", generate_latest(registry).decode())


CREATED = re.compile(r"^(\w+_created(?:\{.*\})?) \S+$", re.M)

EVENTS = [
    Event("acquired", "a:1", "a", "mem", "acquire", "acquired", 0.0001),
    Event("acquired", "a:2", "a", "mem", "lock", "acquired", 0.0005),  # on a bound: its bucket
    Event("not_acquired", "a:1", "a", "mem", "acquire", "taken", 0.3),
    Event("not_acquired", "b", "b", "pg", "lock", "error", None),
    Event("released", "a:1", "a", "mem", "acquire", "released", 0.01),
    Event("acquired", "o", "o", "mem", "owner", "acquired", 2.5),
    Event("lost", "a:2", "a", "mem", "lock", "deadline", 1.0),
    Event("renewed", "", "", "mem", "acquire", "renewed", 0.002, count=3),
    Event("renewed", "", "", "pg", "acquire", "error", 40.0),
    Event("run_skipped", "r:1", "r:{n}", "mem", "run", "in_progress"),
    Event("not_acquired", "e", "e", "mem", "leader", "taken", 0.0),
    Event("leadership_acquired", "f", "f", "mem", "leader", "acquired"),
    Event("acquired", "f", "f", "mem", "leader", "acquired", 1e9),
    Event("leadership_lost", "f", "f", "mem", "leader", "lost"),
    Event("released", "x", "x", "mem", "owner", "handed back", 5.0),  # never seen acquired
    Event("acquired", "a:3", "a", "mem", "acquire", "acquired", -1.0),
]


def both_ways(events_: list[Event]) -> tuple[CollectorRegistry, CollectorRegistry]:
    """``events_`` given to the one-process exporter and to prometheus_client's metrics (the
    multiprocess mode's exporter, here on plain values), each on a registry of its own."""
    counted, metrics = CollectorRegistry(), CollectorRegistry()
    counts = CountsExporter(FAMILIES, counted)
    real = MetricsExporter(FAMILIES, metrics)
    for event in events_:
        counts.consume(event)
        real.consume(event)
    return counted, metrics


def test_in_one_process_the_counts_scrape_as_prometheus_clients_metrics_do() -> None:
    assert not PrometheusExporter(CollectorRegistry()).multiprocess  # no PROMETHEUS_MULTIPROC_DIR
    began = time.time()
    counted, metrics = both_ways(EVENTS)
    assert masked(counted) == masked(metrics)
    scrape = Scrape(counted)
    mem = {"lock": "a", "store": "mem"}
    assert scrape("django_locks_acquisitions_total", outcome="acquired", **mem) == 3
    assert (
        scrape("django_locks_acquire_wait_seconds_bucket", le="0.0005", outcome="acquired", **mem)
        == 3
    )
    assert scrape("django_locks_held", **mem) == 1
    assert scrape("django_locks_owner_leases", lock="x", store="mem") == -1
    assert scrape("django_locks_leader", election="e", store="mem") == 0
    created = [s for s in scrape.samples if s.name.endswith("_created")]
    assert len(created) == 2 * 6 + 2 + 1 + 1  # waits and acquisitions, renewals, lost, skipped
    assert all(began <= s.value <= time.time() for s in created)
    disable_created_metrics()  # prometheus_client's switch turns both off
    try:
        assert "_created" not in generate_latest(counted).decode()
        assert generate_latest(counted) == generate_latest(metrics)
    finally:
        enable_created_metrics()


kinds = st.sampled_from(typing.get_args(events.EventKind))
uses = st.sampled_from(typing.get_args(events.Use))
outcomes = st.sampled_from(["acquired", "taken", "error", "released", "deadline", "renewed"])
# Durations come from a clock: never NaN (bisect and prometheus_client's loop would part there).
durations = st.none() | st.floats(allow_nan=False) | st.sampled_from([*WAIT_BUCKETS, 0.0, 3.0])
random_events = st.builds(
    Event,
    kind=kinds,
    key=st.just("k"),
    label=st.sampled_from(["a", "b:{n}"]),
    store=st.sampled_from(["mem", "pg"]),
    use=uses,
    outcome=outcomes,
    duration=durations,
)


@given(st.lists(random_events, max_size=30))
def test_any_events_scrape_the_same_counted_or_as_prometheus_clients_metrics(
    events_: list[Event],
) -> None:
    counted, metrics = both_ways(events_)
    assert masked(counted) == masked(metrics)


def test_scrapes_while_threads_count_and_make_series() -> None:
    registry = CollectorRegistry()
    consume = PrometheusExporter(registry).consume
    pairs, threads = 1000, 3
    scraping, done = threading.Event(), threading.Event()
    scrapes: list[bytes] = []
    errors: list[BaseException] = []

    def work(n: int) -> None:
        scraping.wait(10)
        for i in range(pairs):
            label = f"t{n}-{i}"  # a new series each time, made while the scraper reads
            consume(Event("acquired", "k", label, "mem", "lock", "acquired", 0.001))
            consume(Event("released", "k", label, "mem", "lock", "released", 0.01))

    def scrape_until_done() -> None:
        try:
            while not done.is_set():
                scrapes.append(generate_latest(registry))
                scraping.set()
        except BaseException as exc:  # a dict changed under the scrape, say
            errors.append(exc)
            scraping.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        scraper = threading.Thread(target=scrape_until_done)
        scraper.start()
        workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        done.set()
        scraper.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == [] and len(scrapes) > 1
    scrape = Scrape(registry)
    acquired = [
        s.value
        for s in scrape.samples
        if s.name == "django_locks_acquisitions_total" and s.labels["outcome"] == "acquired"
    ]
    assert len(acquired) == pairs * threads and set(acquired) == {1}
    assert {s.value for s in scrape.samples if s.name == "django_locks_held"} == {0}


def test_a_registry_takes_one_exporter() -> None:
    registry = CollectorRegistry()
    PrometheusExporter(registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        PrometheusExporter(registry)


def test_locks_metrics_turns_the_default_exporter_on_and_off() -> None:
    service = Locks(InMemoryStore())
    label = f"prom-on-{uuid.uuid4().hex[:8]}"  # the default registry outlives the test
    labels = {"lock": label, "store": str(service.store), "outcome": "acquired"}
    name = "django_locks_acquisitions_total"
    on = {
        "BACKEND": "django_locks.stores.InMemoryStore",
        "ALLOW_IN_MEMORY_STORAGE": True,
        "METRICS": ["prometheus"],
    }
    with override_settings(LOCKS=on):
        assert exporters.active() == ["prometheus"]
        with service.lock(f"{label}:1"):
            pass
        assert Scrape(REGISTRY)(name, **labels) == 1
    assert exporters.active() == []
    with service.lock(f"{label}:2"):
        pass
    assert Scrape(REGISTRY)(name, **labels) == 1  # off: not counted
    assert prometheus.consume == prometheus.exporter.consume


def test_a_forked_child_reports_none_of_its_parents_counts() -> None:
    """Celery prefork and gunicorn fork workers; without PROMETHEUS_MULTIPROC_DIR the parent's
    numbers would be the child's: its detached locks held, its counters exported twice."""
    import os

    service = Locks(InMemoryStore())
    label = f"prom-fork-{uuid.uuid4().hex[:8]}"  # the default registry outlives the test
    held = {"lock": label, "store": str(service.store)}
    on = {
        "BACKEND": "django_locks.stores.InMemoryStore",
        "ALLOW_IN_MEMORY_STORAGE": True,
        "METRICS": ["prometheus"],
    }
    with override_settings(LOCKS=on):
        lock = service.acquire(f"{label}:1")
        assert lock is not None
        assert Scrape(REGISTRY)("django_locks_held", **held) == 1
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: what a scrape of it shows, then leave at once
            try:
                os.write(
                    write, json.dumps(Scrape(REGISTRY).get("django_locks_held", **held)).encode()
                )
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read) as answer:
            in_child = json.loads(answer.read() or '"no answer"')
        os.waitpid(pid, 0)
        assert in_child is None
        assert Scrape(REGISTRY)("django_locks_held", **held) == 1
        lock.release()


def run_child(*args: str) -> str:
    """A fresh startup (``tests.children.metrics_startup``, the OpenTelemetry tests' too)."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.children.metrics_startup", *args],
        env=child_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_without_prometheus_client_the_error_names_the_extra() -> None:
    line = run_child("missing", "prometheus")
    assert line.startswith(ImproperlyConfigured.__name__), line
    assert "prometheus-client is not installed" in line
    assert 'pip install "django-distributed-locks[prometheus]"' in line


def test_with_metrics_off_neither_prometheus_client_nor_the_exporter_is_imported() -> None:
    imported = json.loads(run_child("off"))
    names = ("prometheus_client", "django_locks.contrib.prometheus")
    assert {name: name in imported for name in names} == {
        "prometheus_client": False,
        "django_locks.contrib.prometheus": False,
    }


class Worker:
    """A worker process of a multiprocess deployment (tests/children/prometheus_exporter.py)."""

    def __init__(self, env: dict[str, str], prefix: str, count: int) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.children.prometheus_exporter",
                "worker",
                prefix,
                str(count),
            ],
            env=env,
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        assert self.process.stdout is not None
        threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True).start()

    def _read(self, stdout: IO[str]) -> None:
        for line in stdout:
            self.lines.put(line.rstrip("\n"))

    def line(self, prefix: str, timeout: float = 30) -> Any:
        """The JSON after the next line starting with ``prefix``."""
        try:
            while True:
                line = self.lines.get(timeout=timeout)
                if line.startswith(prefix + " "):
                    return json.loads(line[len(prefix) + 1 :])
        except queue.Empty:
            self.process.kill()
            _, err = self.process.communicate()
            raise AssertionError(
                f"no {prefix!r} line from the worker; its stderr:\n{err}"
            ) from None

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def exit(self) -> None:
        self.send("exit")
        assert self.process.wait(10) == 0

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate()


@pytest.mark.redis
def test_multiprocess_mode_sums_two_workers_and_drops_a_dead_ones_gauges(
    redis_server: Any, tmp_path: Path
) -> None:
    directory = tmp_path / "prometheus"
    directory.mkdir()
    prefix = f"prom-mp-{uuid.uuid4().hex[:8]}"
    locks = {
        "BACKEND": "django_locks.stores.RedisStore",
        "OPTIONS": {"url": redis_server.url},
        "TTL": "2s",
        "METRICS": ["prometheus"],
    }
    env = child_env(settings="tests.leader_settings", locks=locks, log_level="NONE")
    env["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    workers = []
    try:
        first = Worker(env, prefix, 3)
        workers.append(first)
        assert first.line("ready")["leading"] is True  # alone: it leads
        second = Worker(env, prefix, 5)
        workers.append(second)
        assert second.line("ready")["leading"] is False  # the election has its leader

        def scrape() -> Scrape:
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=str(directory))
            return Scrape(registry)

        now = scrape()
        store = now.label_values("django_locks_held", "store").pop()
        held = {"lock": prefix, "store": store}
        election = {"election": f"{prefix}-election", "store": store}
        total = "django_locks_acquisitions_total"
        assert now(total, outcome="acquired", **held) == 8  # the counters sum: 3 + 5
        assert now("django_locks_held", **held) == 8  # the gauge: the live sum
        assert now("django_locks_leader", **election) == 1  # one leader, one follower
        assert now(total, lock=f"{prefix}-election", store=store, outcome="taken") >= 1
        assert now("django_locks_held", lock=f"{prefix}-election", store=store) == 1

        first.exit()  # dies holding its locks and the leadership (os._exit)
        left = scrape()
        assert left("django_locks_held", **held) == 8  # its file is still read: dead, not gone
        mark_process_dead(first.process.pid, str(directory))
        gone = scrape()
        assert gone("django_locks_held", **held) == 5  # its gauges dropped out
        assert gone("django_locks_leader", **election) == 0  # no leader: the follower shows 0
        assert gone(total, outcome="acquired", **held) == 8  # counters keep what it counted

        # Its lease lapses (ttl 2 s) and the follower takes over: one leader again.
        def second_leads() -> bool:
            second.send("leading?")
            return bool(second.line("leading"))

        eventually(second_leads, timeout=20, every=0.5, what="the second worker leading")
        assert scrape()("django_locks_leader", **election) == 1
    finally:
        for worker in workers:
            worker.kill()
