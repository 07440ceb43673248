"""Permits against plain locks: ``python -m benchmarks --permits`` (issue 22, SPEC section 12).

On each store, in one run:

* **acquire + release** of a permit (``permits=3``) against a plain lock's, measured side by side
  in round-robin blocks (as the main run's latencies), with the store's own calls under each
  (``acquire_as`` + ``end`` against ``acquire_permit`` + ``end`` of the slot): the in-memory store
  (CPU alone), SQLite (a file), PostgreSQL and Redis;
* **renewal**: 1,000 permits held by one process (10 keys of 100 permits), counted through
  :class:`~benchmarks.counting.CountingStore`: round trips (``renew`` and ``renew_many`` calls)
  per renewal period;
* **handoff**: 8 threads, one key with 3 permits, each holder keeping its permit 200 ms; what
  woke each next holder, a release notice or a backoff step (``benchmarks/permits_handoff.py``
  says how it is counted). SQLite sends no notices: not measured. On Redis it is measured a
  second time with redis-server's ``hz`` at 100 (not a goal): a BLPOP's timeout ends at the
  server's next timer tick (every 1/hz seconds), so with the default 10 the waiters' pauses end
  together on 100 ms ticks, and a holder that took its permit on a tick releases it 200 ms
  later, on a tick, just as the timed-out waiters try again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks import environment
from benchmarks.counting import CountingStore
from benchmarks.measure import Latency, latencies, ratio, table, us
from benchmarks.permits_handoff import PERMITS, section_handoff

HELD = 1000
TTL_MS = 30_000
RATIO_GOAL = 1.3
ROUND_TRIPS_GOAL = 2
NOTICE_GOAL = 0.9
FINE_HZ = 100
HZ_NOTE = f", again with redis-server's hz {FINE_HZ} (not a goal)"
STORES = ("memory", "sqlite", "postgres", "redis")
TITLES = {
    "memory": "the in-memory store",
    "sqlite": "SQLite (the database store on a file)",
    "postgres": "PostgreSQL",
    "redis": "Redis",
}


@dataclasses.dataclass(frozen=True)
class PermitsPlan:
    rounds: int = 10
    block_memory: int = 2000
    block_server: int = 200
    warmup: int = 50
    renewal_keys: int = 10
    renewal_ttl: float = 6.0
    renewal_settle_periods: int = 2
    renewal_periods: int = 5
    handoffs: int = 150
    hold: float = 0.2


QUICK = PermitsPlan(
    rounds=2,
    block_memory=20,
    block_server=10,
    warmup=3,
    renewal_ttl=3.0,
    renewal_periods=2,
    handoffs=6,
    hold=0.05,
)


def say(text: str = "") -> None:
    print(text, flush=True)


# Acquire + release.


def lock_pair(locks: Any, key: str, permits: int) -> Callable[[], None]:
    """``locks.acquire(key)`` (``permits=`` when above 1), then ``release()``."""
    options = {"permits": permits} if permits > 1 else {}

    def pair() -> None:
        lock = locks.acquire(key, **options)
        if lock is None:
            raise RuntimeError(f"{key!r} was taken")
        lock.release()

    return pair


def store_pair(store: Any, key: str, permits: int) -> Callable[[], None]:
    """What the service asks of the store for one pair, without the ``Lock`` around it."""
    from django_locks.holders import this_process
    from django_locks.owners import new_owner
    from django_locks.stores.base import PermitGrant, Slot

    holder = this_process()

    def pair() -> None:
        owner = new_owner()
        if permits == 1:
            if not isinstance(store.acquire_as(key, owner, TTL_MS, holder), int):
                raise RuntimeError(f"{key!r} was taken")
            store.end(key, owner, "released")
            return
        grant = store.acquire_permit(key, owner, TTL_MS, permits, holder)
        if not isinstance(grant, PermitGrant):
            raise RuntimeError(f"no permit of {key!r} was free")
        store.end(Slot(key, grant.permit), owner, "released")

    return pair


def section_pair(store_name: str, locks: Any, plan: PermitsPlan) -> dict[str, Any]:
    prefix = f"bench:permits:pair:{store_name}"
    operations = {
        "plain lock": lock_pair(locks, f"{prefix}:plain", 1),
        f"permit (permits={PERMITS})": lock_pair(locks, f"{prefix}:permit", PERMITS),
        "  plain: store calls alone": store_pair(locks.store, f"{prefix}:plain-store", 1),
        "  permit: store calls alone": store_pair(locks.store, f"{prefix}:permit-store", PERMITS),
    }
    block = plan.block_memory if store_name == "memory" else plan.block_server
    timed = latencies(operations, rounds=plan.rounds, block=block, warmup=plan.warmup)
    names = list(timed)
    plain, permit, plain_store, permit_store = (timed[name] for name in names)

    def row(name: str, value: Latency, base: Latency) -> list[str]:
        return [
            name,
            us(value.median),
            us(value.p99),
            ratio(value.median, base.median),
            us(value.cpu),
        ]

    say(
        f"Uncontended acquire + release, one thread, a permit against a plain lock ({plan.rounds} "
        f"rounds of {block}; client CPU per pair, every thread's):"
    )
    say(
        table(
            ["", "median", "p99", "x plain", "client CPU"],
            [
                row(names[0], plain, plain),
                row(names[1], permit, plain),
                row(names[2], plain_store, plain_store),
                row(names[3], permit_store, plain_store),
            ],
        )
    )
    say()
    return {
        "plain": plain.as_dict(),
        "permit": permit.as_dict(),
        "plain_store_calls": plain_store.as_dict(),
        "permit_store_calls": permit_store.as_dict(),
        "ratio": round(permit.median / plain.median, 3),
        "store_calls_ratio": round(permit_store.median / plain_store.median, 3),
    }


# 1,000 held permits.


def section_renewal(
    store_name: str, backend: str, options: dict[str, Any], plan: PermitsPlan
) -> dict[str, Any]:
    from django_locks import Locks

    store = CountingStore(backend=backend, options=options)
    locks = Locks(store, ttl=plan.renewal_ttl)
    period = plan.renewal_ttl / 3
    per_key = HELD // plan.renewal_keys
    started = time.perf_counter()
    held = []
    for index in range(HELD):
        key = f"bench:permits:renewal:{store_name}:{index % plan.renewal_keys}"
        lock = locks.acquire(key, permits=per_key)
        if lock is None:
            raise RuntimeError(f"no permit of {key!r} was free")
        held.append(lock)
    acquired_in = time.perf_counter() - started
    slots = len({(lock.key, lock.permit) for lock in held})
    time.sleep(period * plan.renewal_settle_periods)
    store.reset()
    time.sleep(period * plan.renewal_periods)
    round_trips = store.calls("renew", "renew_many")
    renewed = store.renewed
    batches = sorted(store.batch_seconds)
    lost = sum(not lock.held for lock in held)
    for lock in held:
        lock.release()
    store.close()
    figures = {
        "permits": HELD,
        "keys": plan.renewal_keys,
        "distinct_slots": slots,
        "ttl_s": plan.renewal_ttl,
        "periods": plan.renewal_periods,
        "round_trips": round_trips,
        "round_trips_per_period": round_trips / plan.renewal_periods,
        "leases_renewed_per_period": renewed / plan.renewal_periods,
        "batch_median_ms": round(batches[len(batches) // 2] * 1e3, 2) if batches else None,
        "lost": lost,
    }
    say(
        f"Renewal: {HELD:,} permits held by one process ({plan.renewal_keys} keys of {per_key} "
        f"permits, {slots:,} distinct slots; ttl {plan.renewal_ttl:g}s, renewed every "
        f"{period:g}s; acquired in {acquired_in:.2f}s), counted over {plan.renewal_periods} "
        "periods:"
    )
    batch = f"{figures['batch_median_ms']} ms" if batches else "-"
    say(
        table(
            ["round trips / period", "leases renewed / period", "one renew_many", "lost"],
            [
                [
                    f"{figures['round_trips_per_period']:g}",
                    f"{figures['leases_renewed_per_period']:g}",
                    batch,
                    str(lost),
                ]
            ],
        )
    )
    say()
    return figures


# The stores.


def configure_django(postgres: Any, sqlite_file: str) -> None:
    """Django with the ``Lease`` table migrated on the benchmark's PostgreSQL (``default``, when
    measured) and on a SQLite file (alias ``sqlite``)."""
    import django
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections

    sqlite = {"ENGINE": "django.db.backends.sqlite3", "NAME": sqlite_file}
    databases: dict[str, Any] = {"default": sqlite, "sqlite": sqlite}
    if postgres is not None:
        databases["default"] = postgres.database_settings(environment.DATABASE)
    settings.configure(
        DEBUG=False,
        USE_TZ=True,
        SECRET_KEY="django_locks-benchmarks",
        INSTALLED_APPS=["django_locks"],
        DATABASES=databases,
        LOCKS={"BACKEND": "django_locks.stores.DatabaseStore"},  # unused: stores made here
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        LOGGING_CONFIG=None,
    )
    django.setup()
    for alias in ["sqlite", *(["default"] if postgres is not None else [])]:
        call_command("migrate", database=alias, verbosity=0)
    connections.close_all()


def store_of(name: str, servers: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The backend's dotted path and options of store ``name``."""
    if name == "memory":
        return "django_locks.stores.InMemoryStore", {}
    if name == "sqlite":
        return "django_locks.stores.DatabaseStore", {"using": "sqlite"}
    if name == "postgres":
        return "django_locks.stores.DatabaseStore", {"using": "default"}
    return "django_locks.stores.RedisStore", {"url": servers["redis"].url}


def heading(name: str, servers: dict[str, Any]) -> str:
    if name == "postgres":
        shown = environment.postgres_settings(servers["postgres"])
        return (
            f"== PostgreSQL {shown['server_version']} (fsync {shown['fsync']}, "
            f"synchronous_commit {shown['synchronous_commit']}) =="
        )
    if name == "redis":
        with servers["redis"].client() as client:
            version = client.info("server")["redis_version"]
        return f"== Redis {version} (appendonly no) =="
    return f"== {TITLES[name][0].upper()}{TITLES[name][1:]} =="


@contextlib.contextmanager
def redis_hz(server: Any, hz: int) -> Iterator[None]:
    """redis-server's ``hz`` for the block (its default, 10, after it)."""
    with server.client() as client:
        before = client.config_get("hz")["hz"]
        client.config_set("hz", hz)
        try:
            yield
        finally:
            client.config_set("hz", before)


def run_store(name: str, servers: dict[str, Any], plan: PermitsPlan) -> dict[str, Any]:
    from django.utils.module_loading import import_string

    from django_locks import Locks

    backend, options = store_of(name, servers)
    say(heading(name, servers))
    say()
    store = import_string(backend)(**options)
    if not store.supports_permits:
        say(f"({store} does not offer permits: not measured)")
        say()
        store.close()
        return {"supports_permits": False}
    locks = Locks(store)
    results: dict[str, Any] = {"supports_permits": True}
    try:
        results["pair"] = section_pair(name, locks, plan)
        if name in ("postgres", "redis"):
            results["renewal"] = section_renewal(name, backend, options, plan)
        if name != "sqlite":  # SQLite sends no release notices: its waiters poll
            results["handoff"] = section_handoff(
                name, locks, handoffs=plan.handoffs, hold=plan.hold
            )
        if name == "redis":
            with redis_hz(servers["redis"], FINE_HZ):
                results["handoff_fine_hz"] = section_handoff(
                    name, locks, handoffs=plan.handoffs, hold=plan.hold, note=HZ_NOTE
                )
    finally:
        store.close()
    return results


def verdicts(stores: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for name, figures in stores.items():
        if not figures.get("supports_permits"):
            continue
        pair = figures["pair"]
        found.append(
            {
                "store": name,
                "goal": f"permit acquire+release <= {RATIO_GOAL}x a plain lock's",
                "measured": f"{pair['ratio']:.2f}x (store calls {pair['store_calls_ratio']:.2f}x)",
                "met": pair["ratio"] <= RATIO_GOAL,
            }
        )
        renewal = figures.get("renewal")
        if renewal is not None:
            per_period = renewal["round_trips_per_period"]
            found.append(
                {
                    "store": name,
                    "goal": f"1,000 held permits: <= {ROUND_TRIPS_GOAL} round trips per period",
                    "measured": f"{per_period:g} (lost {renewal['lost']})",
                    "met": per_period <= ROUND_TRIPS_GOAL and renewal["lost"] == 0,
                }
            )
        handoff = figures.get("handoff")
        if handoff is not None:
            found.append(
                {
                    "store": name,
                    "goal": f"handoff: >= {NOTICE_GOAL:.0%} woken by a release notice",
                    "measured": (
                        f"{handoff['notice_share']:.1%} of {handoff['handoffs']} "
                        f"({handoff['latency']['median_us']:g} us)"
                    ),
                    "met": handoff["notice_share"] >= NOTICE_GOAL,
                }
            )
    return found


@contextlib.contextmanager
def placed(servers: dict[str, Any], pinned: bool) -> Iterator[None]:
    """This process on one core and the servers on the other for the block, if ``pinned``."""
    if not pinned:
        yield
        return
    placement = environment.Placement(servers)
    if not placement.possible:
        raise environment.Unavailable("--pinned needs two cores")
    with placement.pinned():
        yield


def main(*, quick: bool, stores: set[str] | None = None, pinned: bool = False) -> dict[str, Any]:
    """Measure ``stores`` (default: all of :data:`STORES`); the figures and the verdicts."""
    plan = QUICK if quick else PermitsPlan()
    chosen = [name for name in STORES if stores is None or name in stores]
    results: dict[str, Any] = {"stores": {}}
    with tempfile.TemporaryDirectory(prefix="django_locks-permits-") as folder:
        with environment.servers(set(chosen)) as servers:
            configure_django(servers.get("postgres"), os.path.join(folder, "locks.sqlite3"))
            with placed(servers, pinned):
                for name in chosen:
                    results["stores"][name] = run_store(name, servers, plan)
    results["goals"] = verdicts(results["stores"])
    say("== Against the goals of issue 22 ==")
    say(
        table(
            ["store", "goal", "measured", ""],
            [
                [v["store"], v["goal"], v["measured"], "met" if v["met"] else "MISSED"]
                for v in results["goals"]
            ],
            left=3,
        )
    )
    return results
