"""Run the benchmarks: ``python -m benchmarks`` (or ``python benchmarks/run.py``) from the repo.

Starts a throwaway PostgreSQL (fsync on) and redis-server, measures django_locks on each store
against the round-trip floor and the peers in the same run, prints the figures and how they
compare with the goals of issues 10 to 17. ``--quick`` runs tiny iteration counts (the smoke
test); ``--json FILE`` also writes every figure as JSON; ``--pinned`` runs every section with this
process pinned to one core and the servers to the other (a server on other hardware: the
client's CPU per operation then shows in its throughput); ``--admin`` measures the admin's
Leases page against a plain ``ModelAdmin`` instead (``benchmarks/admin.py``, issue 20), on
PostgreSQL alone; ``--exporters`` the metrics exporters' cost per acquire + release, no server
(``benchmarks/exporters.py``, issue 21); ``--permits`` permits against plain locks on every
store (``benchmarks/permits.py``, issue 22; ``--store`` and ``--pinned`` apply); ``--atomic``
a block of one UPDATE inside ``lock.atomic()`` against the same inside ``transaction.atomic()``
on PostgreSQL and SQLite (``benchmarks/atomic.py``, issue 25; ``--store`` and ``--pinned``
apply); ``--etcd`` the etcd store on a three-member cluster of its own against two raw etcd
transactions, its renewals counted and its handoff's wake-ups classed (``benchmarks/etcd.py``,
issue 28; ``--pinned`` applies). Without ``--pinned``, the PostgreSQL
16-thread throughput against a raw LISTEN/NOTIFY lease is measured both ways. Counts (round
trips, store calls) are exact; times depend on the machine: read them as ratios measured side by
side.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import contenders, environment
from benchmarks.measure import (
    Contender,
    Handoff,
    Rate,
    best_of,
    handoff,
    latencies,
    ratio,
    table,
    throughput,
    us,
)

THREADS = (1, 4, 16)
WAITERS = 8
ASYNC_HANDOFF = "  async, through aacquire(wait=...)"
HANDOFF_TURNS = 4
RENEWAL_LOCKS = 1000
STORE_CALLS = "  its store calls alone"
RAW_PING = "  2 x PING, raw socket"
PREPARED = "  with prepared statements"
SQL_FUNCTIONS = "  its SQL functions on psycopg"
RAW_STORE_SQL = "raw lease on its SQL (psycopg)"
GOAL_THREADS = 16
GOAL_RUNS = 5


@dataclasses.dataclass(frozen=True)
class Plan:
    """Iteration counts: the full run, or ``--quick``."""

    rounds: int = 10
    block_postgres: int = 200
    block_redis: int = 500
    warmup: int = 50
    throughput_seconds: float = 2.0
    handoffs: int = 200
    handoffs_polling: int = 60
    hold: float = 0.01
    renewal_ttl: float = 6.0
    renewal_settle_periods: int = 2
    renewal_periods: int = 5
    owner_calls: int = 100_000
    goal_runs: int = GOAL_RUNS


QUICK = Plan(
    rounds=2,
    block_postgres=10,
    block_redis=10,
    warmup=3,
    throughput_seconds=0.2,
    handoffs=5,
    handoffs_polling=3,
    hold=0.005,
    renewal_ttl=3.0,
    renewal_settle_periods=2,
    renewal_periods=2,
    owner_calls=1000,
    goal_runs=2,
)


def say(text: str = "") -> None:
    print(text, flush=True)


def cpu(seconds: float) -> str:
    """Process CPU time per operation, in microseconds."""
    return us(seconds) if seconds == seconds else "-"


# The sections, each measured on one store.


def section_latency(
    results: dict[str, Any], floor: Contender, entries: list[Contender], block: int, plan: Plan
) -> None:
    sessions = {c.name: c.open() for c in [floor, *entries]}
    operations = {
        name: functools.partial(session.pair, f"bench:latency:{index}")
        for index, (name, session) in enumerate(sessions.items())
    }
    timed = latencies(operations, rounds=plan.rounds, block=block, warmup=plan.warmup)
    for session in sessions.values():
        session.close()
    base = timed[floor.name]
    rows = []
    for name, latency in timed.items():
        rows.append(
            [
                name,
                us(latency.median),
                us(latency.p99),
                ratio(latency.median, base.median),
                ratio(latency.p99, base.p99),
                cpu(latency.cpu),
            ]
        )
        results["latency"][name] = {
            **latency.as_dict(),
            "ratio_to_floor": round(latency.median / base.median, 3),
        }
    say(
        "Uncontended acquire + release, one thread (ratios to the floor's median / p99; client "
        "CPU: this process's CPU time per pair, every thread's):"
    )
    say(table(["", "median", "p99", "x floor", "p99 x floor", "client CPU"], rows))
    say()


def section_throughput(results: dict[str, Any], entries: list[Contender], plan: Plan) -> None:
    rows = []
    for contender in entries:
        figures: dict[int, Rate] = {}
        for threads in THREADS:
            figures[threads] = throughput(
                contender, threads, plan.throughput_seconds, f"bench:tp:{contender.name}"
            )
        results["throughput"][contender.name] = {
            str(t): round(v.per_second) for t, v in figures.items()
        }
        results.setdefault("throughput_cpu_us", {})[contender.name] = {
            str(t): round(v.cpu * 1e6, 1) for t, v in figures.items()
        }
        rows.append(
            [
                contender.name,
                *(f"{figures[t].per_second:,.0f}/s ({cpu(figures[t].cpu)})" for t in THREADS),
            ]
        )
    say(
        "Throughput: acquire + release pairs per second, each thread on a key of its own (client "
        "CPU per pair):"
    )
    say(table(["", *(f"{t} thread{'s' if t > 1 else ''}" for t in THREADS)], rows))
    say()


def section_goal_throughput(
    results: dict[str, Any],
    placement: environment.Placement,
    ours: Contender,
    reference: Contender,
    plan: Plan,
    modes: list[bool],
) -> None:
    """django_locks' throughput with GOAL_THREADS threads against ``reference``'s, in
    ``plan.goal_runs`` interleaved runs per mode (``True``: pinned); the medians compared."""
    modes = [pinned for pinned in modes if placement.possible or not pinned]
    rates: dict[bool, dict[str, list[Rate]]] = {
        pinned: {ours.name: [], reference.name: []} for pinned in modes
    }
    for run in range(plan.goal_runs):
        for pinned in modes:
            order = [ours, reference] if run % 2 == 0 else [reference, ours]
            with placement.pinned(pinned):
                for contender in order:
                    rates[pinned][contender.name].append(
                        throughput(
                            contender,
                            GOAL_THREADS,
                            plan.throughput_seconds,
                            f"bench:goal:{contender.name}",
                        )
                    )
    rows = []
    figures = results["goal_throughput"] = {}
    for pinned in modes:
        mode = "pinned" if pinned else "unpinned"
        found: dict[str, Any] = {}
        for name, runs in rates[pinned].items():
            found[name] = {
                "per_second": round(statistics.median(r.per_second for r in runs)),
                "cpu_us": round(statistics.median(r.cpu for r in runs) * 1e6, 1),
                "runs": [r.as_dict() for r in runs],
            }
        ratios = [
            a.per_second / b.per_second
            for a, b in zip(rates[pinned][ours.name], rates[pinned][reference.name], strict=True)
        ]
        found["ratio"] = round(
            found[ours.name]["per_second"] / found[reference.name]["per_second"], 3
        )
        found["run_ratios"] = [round(value, 3) for value in ratios]
        figures[mode] = found
        rows.append(
            [
                mode,
                f"{found[ours.name]['per_second']:,}/s",
                f"{found[reference.name]['per_second']:,}/s",
                f"{found['ratio']:.2f}x",
                f"{min(ratios):.2f}x to {max(ratios):.2f}x",
                f"{found[ours.name]['cpu_us']:g} us",
                f"{found[reference.name]['cpu_us']:g} us",
            ]
        )
    if not placement.possible:
        say("(Pinned: not possible, this machine has fewer than two cores.)")
    say(
        f"Throughput with {GOAL_THREADS} threads, django_locks against the {reference.name}: "
        f"medians of {plan.goal_runs} interleaved runs (pinned: this process on core "
        f"{environment.CLIENT_CPU}, the servers on core {environment.SERVER_CPU}):"
    )
    say(
        table(
            [
                "",
                ours.name,
                "raw lease",
                "ratio",
                "ratio per run",
                "CPU / pair",
                "raw's CPU / pair",
            ],
            rows,
        )
    )
    say("  (CPU / pair: this process's CPU time, every thread's, per acquire + release.)")
    say()


def section_handoff(
    results: dict[str, Any], entries: list[tuple[Contender, bool]], reference: str, plan: Plan
) -> None:
    measured: dict[str, Handoff] = {}
    names = {contender.name for contender, _ in entries}
    # The threaded and the async handoff of django_locks are compared with each other: they are
    # measured in turns (HANDOFF_TURNS each), so that both see the same machine.
    turns = HANDOFF_TURNS if {"django_locks", ASYNC_HANDOFF} <= names else 1
    for turn in range(turns):
        for contender, polling in entries:
            paired = contender.name in ("django_locks", ASYNC_HANDOFF)
            if turn and not paired:
                continue
            count = plan.handoffs_polling if polling else plan.handoffs
            measure = contender.measure_handoff or functools.partial(handoff, contender)
            found = measure(
                f"bench:handoff:{contender.name}",
                waiters=WAITERS,
                handoffs=max(count // turns, 1) if paired else count,
                hold=plan.hold,
            )
            if contender.name in measured:
                found = measured[contender.name].joined(found)
            measured[contender.name] = found
    for contender, _ in entries:
        found = measured[contender.name]
        results["handoff"][contender.name] = {
            **found.latency.as_dict(),
            "handoffs": found.handoffs,
        }
    base = measured[reference].latency.median
    rows = []
    for contender, _ in entries:
        found = measured[contender.name]
        results["handoff"][contender.name]["ratio_to_reference"] = round(
            found.latency.median / base, 3
        )
        rows.append(
            [
                contender.name,
                us(found.latency.median),
                us(found.latency.p99),
                ratio(found.latency.median, base),
                str(found.handoffs),
            ]
        )
    say(
        f"Handoff: {WAITERS} waiting threads, one key; from the holder's release() call to the "
        "next holder's acquisition:"
    )
    say(table(["", "median", "p99", f"x {reference}", "handoffs"], rows))
    if ASYNC_HANDOFF in measured:
        threaded = measured["django_locks"].latency.median
        async_median = measured[ASYNC_HANDOFF].latency.median
        results["handoff"][ASYNC_HANDOFF]["ratio_to_threads"] = round(async_median / threaded, 3)
        say(
            f"  ({ASYNC_HANDOFF.strip()}: {WAITERS} tasks of one event loop, the holder awaiting "
            f"arelease(); {ratio(async_median, threaded)} django_locks' threaded handoff.)"
        )
    say()


def section_renewal(
    results: dict[str, Any], backend: str, options: dict[str, Any], plan: Plan
) -> None:
    from benchmarks.counting import CountingStore
    from django_locks import Locks

    store = CountingStore(backend=backend, options=options)
    locks = Locks(store, ttl=plan.renewal_ttl)
    period = plan.renewal_ttl / 3
    started = time.perf_counter()
    held = []
    for index in range(RENEWAL_LOCKS):
        lock = locks.acquire(f"bench:renewal:{index}")
        if lock is None:
            raise RuntimeError("a renewal benchmark key was taken")
        held.append(lock)
    acquired_in = time.perf_counter() - started
    time.sleep(period * plan.renewal_settle_periods)
    store.reset()
    time.sleep(period * plan.renewal_periods)
    round_trips = store.calls("renew", "renew_many")
    renewed = store.renewed
    batches = list(store.batch_seconds)
    lost = sum(not lock.held for lock in held)
    for lock in held:
        lock.release()
    store.close()
    per_period = round_trips / plan.renewal_periods
    figures = {
        "locks": RENEWAL_LOCKS,
        "ttl_s": plan.renewal_ttl,
        "periods": plan.renewal_periods,
        "round_trips": round_trips,
        "round_trips_per_period": per_period,
        "leases_renewed_per_period": renewed / plan.renewal_periods,
        "batch_median_ms": round(sorted(batches)[len(batches) // 2] * 1e3, 2) if batches else None,
        "lost": lost,
    }
    results["renewal"] = figures
    say(
        f"Renewal: {RENEWAL_LOCKS:,} locks held by one process (ttl {plan.renewal_ttl:g}s, renewed "
        f"every {period:g}s; acquired in {acquired_in:.2f}s), counted over "
        f"{plan.renewal_periods} periods:"
    )
    batch = f"{figures['batch_median_ms']} ms" if batches else "-"
    say(
        table(
            ["round trips / period", "leases renewed / period", "one renew_many", "lost"],
            [[f"{per_period:g}", f"{figures['leases_renewed_per_period']:g}", batch, str(lost)]],
        )
    )
    say()


def section_owner_check(
    results: dict[str, Any], name: str, backend: str, options: dict[str, Any], plan: Plan
) -> None:
    from django.test import override_settings

    from django_locks import locks, on_one_instance
    from django_locks.decorators import release_owner_leases

    config = {
        "BACKEND": "benchmarks.counting.CountingStore",
        "OPTIONS": {"backend": backend, "options": options},
    }
    with override_settings(LOCKS=config):

        def bare() -> None:
            return None

        job = on_one_instance(key=f"bench:{name}:owner-check")(bare)
        job()  # takes the sticky owner lease: one acquire
        store = locks.store
        taken = store.calls("acquire")  # type: ignore[attr-defined]
        store.reset()  # type: ignore[attr-defined]
        me = threading.get_ident()
        for _ in range(plan.owner_calls):
            job()
        calls = store.calls(thread=me)  # type: ignore[attr-defined]
        repeat = 5
        number = max(plan.owner_calls // repeat, 100)
        decorated = best_of(repeat, number, job)
        plain = best_of(repeat, number, bare)
        release_owner_leases()
    overhead = decorated - plain
    results["owner_check"] = {
        "first_call_acquires": taken,
        "calls": plan.owner_calls,
        "store_calls": calls,
        "decorated_us": round(decorated * 1e6, 3),
        "plain_us": round(plain * 1e6, 3),
        "overhead_us": round(overhead * 1e6, 3),
    }
    say(
        f"Owner check of an on_one_instance job that holds its lease ({plan.owner_calls:,} calls, "
        "counted through a counting store):"
    )
    say(
        table(
            ["store calls", "decorated call", "plain call", "decorator overhead"],
            [[str(calls), us(decorated), us(plain), f"{overhead * 1e6:.2f} us"]],
        )
    )
    say()


# The stores.


def run_redis(server: Any, plan: Plan) -> dict[str, Any]:
    from django_locks import Locks
    from django_locks.stores import RedisStore

    results: dict[str, Any] = {"latency": {}, "throughput": {}, "handoff": {}}
    with server.client() as client:
        info = client.info("server")
    results["server"] = {"redis_version": info["redis_version"], "appendonly": "no"}
    say(f"== Redis {info['redis_version']} (appendonly no, no snapshots) ==")
    say()
    locks = Locks(RedisStore(url=server.url))
    ours = contenders.django_locks("django_locks", locks)
    floor = contenders.redis_floor(server.url)
    peers, missing = contenders.redis_peers(server.url)
    results["peers_missing"] = missing
    for name in missing:
        say(f"({name}: not installed; pip install {name})")
    store_calls = contenders.store_calls(STORE_CALLS, locks.store)
    raw_ping = contenders.raw_ping(RAW_PING, server.url)
    section_latency(results, floor, [raw_ping, ours, store_calls, *peers], plan.block_redis, plan)
    say(
        f"  ({RAW_PING.strip()}: two PINGs on a plain socket, without redis-py's client: the\n"
        f"   round trips alone; {STORE_CALLS.strip()}: RedisStore.acquire + release without the\n"
        "   Lock object.)"
    )
    say()
    section_throughput(results, [floor, ours, *peers], plan)
    by_name = {peer.name: peer for peer in peers}
    entries = [(ours, False), (contenders.async_django_locks(ASYNC_HANDOFF, locks), False)]
    if "python-redis-lock" in by_name:
        entries.append((by_name["python-redis-lock"], False))
    entries.append((by_name["redis-py Lock"], True))
    reference = "python-redis-lock" if "python-redis-lock" in by_name else ours.name
    section_handoff(results, entries, reference, plan)
    section_renewal(results, "django_locks.stores.RedisStore", {"url": server.url}, plan)
    section_owner_check(
        results, "redis", "django_locks.stores.RedisStore", {"url": server.url}, plan
    )
    locks.store.close()

    environment.make_redis_durable(server)
    results["durable"] = {}
    locks = Locks(RedisStore(url=server.url))
    durable = {"latency": results["durable"]}
    say("-- The same server with appendonly yes, appendfsync always (what fencing asks for) --")
    section_latency(
        durable,
        floor,
        [contenders.django_locks("django_locks", locks), by_name["redis-py Lock"]],
        plan.block_postgres,
        plan,
    )
    locks.store.close()
    return results


def run_postgres(
    server: Any, plan: Plan, placement: environment.Placement, modes: list[bool]
) -> dict[str, Any]:
    from django_locks import Locks
    from django_locks.stores import DatabaseStore

    results: dict[str, Any] = {"latency": {}, "throughput": {}, "handoff": {}}
    dsn = {
        "host": "127.0.0.1",
        "port": server.port,
        "user": "postgres",
        "dbname": environment.DATABASE,
    }
    contenders.pg_setup(dsn)
    shown = environment.postgres_settings(server)
    results["server"] = shown
    say(
        f"== PostgreSQL {shown['server_version']} (fsync {shown['fsync']}, synchronous_commit "
        f"{shown['synchronous_commit']}, full_page_writes {shown['full_page_writes']}, "
        f"wal_sync_method {shown['wal_sync_method']}) =="
    )
    say()
    conn, select_one = contenders.select_one(dsn)
    write_conn = contenders.pg_connect(dsn)

    def one_write() -> None:
        write_conn.execute(contenders.FLOOR_WRITE, (63,)).fetchone()

    single = latencies(
        {"SELECT 1": select_one, "one committed UPDATE": one_write},
        rounds=plan.rounds,
        block=plan.block_postgres,
        warmup=plan.warmup,
    )
    conn.close()
    write_conn.close()
    results["round_trip"] = {name: value.as_dict() for name, value in single.items()}
    say("One round trip:")
    say(
        table(
            ["", "median", "p99"],
            [[name, us(value.median), us(value.p99)] for name, value in single.items()],
        )
    )
    say()
    locks = Locks(DatabaseStore("default"))
    prepared = Locks(DatabaseStore(environment.PREPARED_ALIAS, listen_using=False))
    ours = contenders.django_locks("django_locks", locks)
    floor = contenders.postgres_floor(dsn)
    advisory, raw = contenders.postgres_peers(dsn)
    raw_sql = contenders.store_sql_lease(RAW_STORE_SQL, dsn)
    entries = [
        ours,
        contenders.store_calls(STORE_CALLS, locks.store),
        contenders.django_locks(PREPARED, prepared),
        contenders.sql_functions(SQL_FUNCTIONS, dsn),
        advisory,
        raw,
        raw_sql,
    ]
    section_latency(results, floor, entries, plan.block_postgres, plan)
    say(
        f"  ({STORE_CALLS.strip()}: DatabaseStore.acquire + release without the Lock object;\n"
        f"   {PREPARED.strip()}: django_locks on an alias whose OPTIONS set\n"
        "   server_side_binding=True, prepare_threshold=5, so psycopg 3 prepares the store's\n"
        "   statements: possible on a direct connection only, not behind PgBouncer < 1.21;\n"
        f"   {SQL_FUNCTIONS.strip()}: the SQL functions the store calls (django_locks_acquire_as,\n"
        "   django_locks_end), called on a plain psycopg connection that prepares them: what\n"
        "   the operations cost the server;\n"
        f"   {RAW_STORE_SQL}: those functions called by a raw psycopg lease, which LISTENs from\n"
        "   its first wait on; the raw LISTEN/NOTIFY lease LISTENs on each of its connections.)"
    )
    say()
    section_throughput(results, [floor, ours, advisory, raw, raw_sql], plan)
    section_goal_throughput(results, placement, ours, raw_sql, plan, modes)
    blocking = Contender("pg_advisory_lock (blocking)", advisory.open)
    section_handoff(
        results,
        [
            (ours, False),
            (contenders.async_django_locks(ASYNC_HANDOFF, locks), False),
            (raw, False),
            (blocking, False),
        ],
        raw.name,
        plan,
    )
    section_renewal(results, "django_locks.stores.DatabaseStore", {"using": "default"}, plan)
    section_owner_check(
        results, "postgres", "django_locks.stores.DatabaseStore", {"using": "default"}, plan
    )
    locks.store.close()
    prepared.store.close()
    return results


# Against the goals of issues 10 to 17.

GOALS = [
    ("postgres", "acquire+release <= 1.15x two committed writes"),
    ("redis", "acquire+release <= 1.2x two PINGs"),
    ("redis", "handoff median <= python-redis-lock's"),
    ("postgres", "handoff median <= 1.2x a raw LISTEN/NOTIFY lease"),
    ("postgres", "async handoff median <= 1.2x the threaded one"),
    ("redis", "async handoff median <= 1.2x the threaded one"),
    ("postgres", "1,000 held locks: <= 2 round trips per renewal period"),
    ("redis", "1,000 held locks: <= 2 round trips per renewal period"),
    ("postgres", "owner check: 0 round trips, decorator overhead < 10 us"),
    ("redis", "owner check: 0 round trips, decorator overhead < 10 us"),
    ("postgres", f"{GOAL_THREADS} threads, pinned: >= 0.8x a raw lease on its SQL"),
]


def verdicts(results: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for store, goal in GOALS:
        figures = results.get(store)
        if not figures:
            continue
        if goal.startswith("acquire"):
            limit = 1.15 if store == "postgres" else 1.2
            value = figures["latency"]["django_locks"]["ratio_to_floor"]
            met, shown = value <= limit, f"{value:.2f}x"
        elif goal.startswith("async handoff"):
            entry = figures["handoff"][ASYNC_HANDOFF]
            value = entry["ratio_to_threads"]
            met, shown = value <= 1.2, f"{value:.2f}x ({entry['median_us']:g} us)"
        elif goal.startswith("handoff"):
            entry = figures["handoff"]["django_locks"]
            limit = 1.2 if store == "postgres" else 1.0
            value = entry["ratio_to_reference"]
            met, shown = value <= limit, f"{value:.2f}x ({entry['median_us']:g} us)"
        elif "pinned" in goal:
            pinned = figures.get("goal_throughput", {}).get("pinned")
            if pinned is None:
                met, shown = False, "not measured (fewer than 2 cores)"
            else:
                value = pinned["ratio"]
                mine = pinned["django_locks"]
                met = value >= 0.8
                shown = f"{value:.2f}x ({mine['per_second']:,}/s, {mine['cpu_us']:g} us CPU)"
        elif "renewal" in goal:
            value = figures["renewal"]["round_trips_per_period"]
            met = value <= 2 and figures["renewal"]["lost"] == 0
            shown = f"{value:g} (lost {figures['renewal']['lost']})"
        else:
            check = figures["owner_check"]
            met = check["store_calls"] == 0 and check["overhead_us"] < 10
            shown = f"{check['store_calls']} calls, {check['overhead_us']:.2f} us"
        found.append({"store": store, "goal": goal, "measured": shown, "met": met})
    return found


def machine() -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average": [round(value, 2) for value in os.getloadavg()],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny iteration counts (smoke test)")
    parser.add_argument("--json", metavar="FILE", help="also write every figure to FILE")
    parser.add_argument(
        "--store",
        action="append",
        choices=["postgres", "redis", "memory", "sqlite"],
        help=(
            "measure this store only (repeatable; default: both; memory, sqlite: --permits; "
            "postgres, sqlite: --atomic)"
        ),
    )
    parser.add_argument(
        "--pinned",
        action="store_true",
        help="pin this process to one core and the servers to the other for every section",
    )
    parser.add_argument(
        "--admin",
        action="store_true",
        help="measure the admin's Leases page against a plain ModelAdmin instead (on PostgreSQL)",
    )
    parser.add_argument(
        "--exporters",
        action="store_true",
        help="measure the metrics exporters' cost per acquire + release instead (no server)",
    )
    parser.add_argument(
        "--permits",
        action="store_true",
        help="measure permits against plain locks instead (every store, or --store's)",
    )
    parser.add_argument(
        "--atomic",
        action="store_true",
        help="measure lock.atomic() against transaction.atomic() instead (PostgreSQL, SQLite)",
    )
    parser.add_argument(
        "--etcd",
        action="store_true",
        help="measure the etcd store on a three-member cluster instead (--pinned applies)",
    )
    args = parser.parse_args(argv)
    if args.etcd:
        if args.store:
            parser.error("--etcd measures its own cluster: --store does not apply")
        return main_etcd(args)
    if args.permits:
        return main_permits(args)
    if args.atomic:
        if set(args.store or ()) - {"postgres", "sqlite"}:
            parser.error("--atomic measures --store postgres and --store sqlite only")
        return main_atomic(args)
    if set(args.store or ()) - {"postgres", "redis"}:
        parser.error("--store memory and --store sqlite are measured with --permits only")
    if args.admin:
        return main_admin(args.quick, args.json)
    if args.exporters:
        return main_exporters(args.quick, args.json)
    plan = QUICK if args.quick else Plan()
    stores = set(args.store or ["postgres", "redis"])
    results: dict[str, Any] = {"machine": machine(), "quick": args.quick, "pinned": args.pinned}
    info = results["machine"]
    say(
        "django_locks benchmarks"
        + (" (--quick: tiny counts, the times mean nothing)" if args.quick else "")
    )
    say(
        f"{info['date']}; Python {info['python']} on {info['platform']}, {info['cpus']} CPUs, "
        f"load average {' '.join(map(str, info['load_average']))}"
        + (
            f"; pinned: this process on core {environment.CLIENT_CPU}, the servers on core "
            f"{environment.SERVER_CPU}"
            if args.pinned
            else ""
        )
    )
    say()
    try:
        with environment.servers(stores) as servers:
            placement = environment.Placement(servers)
            if args.pinned:
                if not placement.possible:
                    raise environment.Unavailable("--pinned needs two cores")
                placement.pin()
            environment.configure_django(servers.get("postgres"))
            if "postgres" in servers:
                modes = [True] if args.pinned else [False, True]
                results["postgres"] = run_postgres(servers["postgres"], plan, placement, modes)
            if "redis" in servers:
                results["redis"] = run_redis(servers["redis"], plan)
    except environment.Unavailable as exc:
        say(f"Cannot run: {exc}")
        return 2
    results["goals"] = verdicts(results)
    say("== Against the goals of issues 10 to 17 ==")
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
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2)
    return 0


def main_admin(quick: bool, json_file: str | None) -> int:
    """``--admin``: the Leases page against a plain ModelAdmin (``benchmarks/admin.py``)."""
    from benchmarks import admin

    results: dict[str, Any] = {"machine": machine(), "quick": quick}
    info = results["machine"]
    say(
        "django_locks benchmarks: the admin"
        + (" (--quick: tiny counts, the times mean nothing)" if quick else "")
    )
    say(
        f"{info['date']}; Python {info['python']} on {info['platform']}, {info['cpus']} CPUs, "
        f"load average {' '.join(map(str, info['load_average']))}"
    )
    say()
    try:
        results["admin"] = admin.main(quick=quick)
    except environment.Unavailable as exc:
        say(f"Cannot run: {exc}")
        return 2
    if json_file:
        with open(json_file, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2)
    return 0


def main_permits(args: argparse.Namespace) -> int:
    """``--permits``: a permit against a plain lock (``benchmarks/permits.py``, issue 22)."""
    from benchmarks import permits

    return _main_section(args, "permits", permits.main)


def main_etcd(args: argparse.Namespace) -> int:
    """``--etcd``: ``EtcdStore`` on a three-member cluster (``benchmarks/etcd.py``, issue 28)."""
    from benchmarks import etcd

    return _main_section(args, "the etcd store", etcd.main)


def main_atomic(args: argparse.Namespace) -> int:
    """``--atomic``: ``lock.atomic()`` against ``transaction.atomic()`` (``benchmarks/atomic.py``,
    issue 25)."""
    from benchmarks import atomic

    return _main_section(args, "lock.atomic()", atomic.main)


def _main_section(args: argparse.Namespace, title: str, run: Callable[..., dict[str, Any]]) -> int:
    """A section measured store by store (``--store``, ``--pinned``): its heading, ``run``'s
    results, and ``--json``."""
    results: dict[str, Any] = {"machine": machine(), "quick": args.quick, "pinned": args.pinned}
    info = results["machine"]
    say(
        f"django_locks benchmarks: {title}"
        + (" (--quick: tiny counts, the times mean nothing)" if args.quick else "")
    )
    say(
        f"{info['date']}; Python {info['python']} on {info['platform']}, {info['cpus']} CPUs, "
        f"load average {' '.join(map(str, info['load_average']))}"
        + (
            f"; pinned: this process on core {environment.CLIENT_CPU}, the servers on core "
            f"{environment.SERVER_CPU}"
            if args.pinned
            else ""
        )
    )
    say()
    try:
        stores = set(args.store) if args.store else None
        results.update(run(quick=args.quick, stores=stores, pinned=args.pinned))
    except environment.Unavailable as exc:
        say(f"Cannot run: {exc}")
        return 2
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2)
    return 0


def main_exporters(quick: bool, json_file: str | None) -> int:
    """``--exporters``: the metrics exporters' cost (``benchmarks/exporters.py``, issue 21)."""
    from benchmarks import exporters

    results: dict[str, Any] = {"machine": machine(), "quick": quick}
    info = results["machine"]
    say(
        "django_locks benchmarks: the metrics exporters"
        + (" (--quick: tiny counts, the times mean nothing)" if quick else "")
    )
    say(
        f"{info['date']}; Python {info['python']} on {info['platform']}, {info['cpus']} CPUs, "
        f"load average {' '.join(map(str, info['load_average']))}"
    )
    say()
    results["exporters"] = exporters.main(quick=quick)
    if json_file:
        with open(json_file, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
