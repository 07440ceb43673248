"""``lock.atomic()`` against ``transaction.atomic()``: ``python -m benchmarks --atomic`` (issue
25, SPEC section 13).

On PostgreSQL and on SQLite (a file in WAL mode, ``transaction_mode`` ``IMMEDIATE``), in one run:
a block of one ``UPDATE`` of a row of a small table of the benchmark's own inside a plain
``transaction.atomic()`` on the store's alias, against the same inside ``lock.atomic()`` of a lock
already held (taken once, before the clock starts), measured side by side in round-robin blocks
(as the main run's latencies); the ratios of the medians and of the p99s (over the plain block).
A third form, the plain block with as many statements ``SELECT 1`` after its ``UPDATE`` as
``lock.atomic()`` adds, tells the cost of the added round trips from the rest (the guard row,
the trigger, the lease check). Counted, not timed: the statements Django runs in each block (an
``execute_wrapper``; ``BEGIN`` and ``COMMIT`` left out), on PostgreSQL the round trips (libpq's
trace of one block), and after the run each form's row, whose value must equal the number of
blocks run (every write committed).

What ``lock.atomic()`` adds (``django_locks/atomic.py``): on PostgreSQL one statement at the
block's start (the guard row and two transaction-local ``set_config``) and one before its COMMIT,
and a deferred trigger that runs inside COMMIT; a plain block of one ``UPDATE`` is three round
trips (``BEGIN``, the ``UPDATE``, ``COMMIT``), ``lock.atomic()``'s five. The goal is the ratio of
the round trips, 5/3: the trigger's work and the guard row's WAL ride on the same COMMIT and its
one flush. On SQLite one check-and-extend ``UPDATE`` of the lease row before COMMIT, in-process:
no round trip to count, no goal, the figures alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks import environment
from benchmarks.measure import latencies, ratio, table, us
from benchmarks.permits import placed

STORES = ("postgres", "sqlite")
TABLE = "bench_atomic_row"
UPDATE = f"UPDATE {TABLE} SET value = value + 1 WHERE id = %s"
PLAIN = "transaction.atomic()"
LOCKED = "lock.atomic()"
DRIVER_ROUND_TRIPS = 2
"""``BEGIN`` and ``COMMIT``, sent by psycopg itself: no ``execute_wrapper`` sees them."""
SQLITE_OPTIONS = {"transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL"}
ALIASES = {"postgres": "default", "sqlite": "sqlite"}


@dataclasses.dataclass(frozen=True)
class AtomicPlan:
    rounds: int = 20
    block: int = 200
    warmup: int = 50


QUICK = AtomicPlan(rounds=2, block=10, warmup=3)


def say(text: str = "") -> None:
    print(text, flush=True)


def configure_django(postgres: Any, sqlite_file: str) -> None:
    """Django with django_locks' tables migrated on the benchmark's PostgreSQL (``default``,
    when measured) and on a SQLite file (alias ``sqlite``, WAL, ``IMMEDIATE``), and on each a
    table of the benchmark's own with one row per form."""
    import django
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections

    sqlite = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": sqlite_file,
        "OPTIONS": SQLITE_OPTIONS,
    }
    databases: dict[str, Any] = {"default": sqlite, "sqlite": sqlite}
    aliases = ["sqlite"]
    if postgres is not None:
        databases["default"] = postgres.database_settings(environment.DATABASE)
        aliases.append("default")
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
    for alias in aliases:
        call_command("migrate", database=alias, verbosity=0)
        with connections[alias].cursor() as cursor:
            cursor.execute(f"CREATE TABLE {TABLE} (id integer PRIMARY KEY, value bigint NOT NULL)")
            cursor.execute(f"INSERT INTO {TABLE} (id, value) VALUES (1, 0), (2, 0), (3, 0)")
    connections.close_all()


def blocks(lock: Any, alias: str, extra: int) -> dict[str, Callable[[], None]]:
    """The forms, each updating a row of its own: plain (id 1), ``lock.atomic()`` (id 2), and
    plain with ``extra`` statements ``SELECT 1`` after its ``UPDATE`` (id 3: as many statements
    as ``lock.atomic()`` runs, without its guard row, trigger and lease check)."""
    from django.db import connections, transaction

    def plain() -> None:
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            cursor.execute(UPDATE, [1])

    def locked() -> None:
        with lock.atomic(), connections[alias].cursor() as cursor:
            cursor.execute(UPDATE, [2])

    def padded() -> None:
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            cursor.execute(UPDATE, [3])
            for _ in range(extra):
                cursor.execute("SELECT 1")

    return {PLAIN: plain, LOCKED: locked, padded_name(extra): padded}


def padded_name(extra: int) -> str:
    return f"  {PLAIN} + {extra} x SELECT 1"


def statements(alias: str, block: Callable[[], None]) -> int:
    """The statements Django runs for one call of ``block`` on ``alias``, but ``BEGIN`` (which
    Django sends itself on SQLite with a ``transaction_mode``, and psycopg on PostgreSQL)."""
    from django.db import connections

    seen: list[str] = []

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        return execute(sql, params, many, context)

    with connections[alias].execute_wrapper(count):
        block()
    return sum(not sql.lstrip().upper().startswith("BEGIN") for sql in seen)


def round_trips(alias: str, block: Callable[[], None]) -> int:
    """The round trips of one call of ``block`` on PostgreSQL: the messages that ask the server
    for an answer (``Query``, ``Sync``) in libpq's trace of Django's connection on ``alias``."""
    from django.db import connections

    conn = connections[alias]
    conn.ensure_connection()
    pgconn = conn.connection.pgconn
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        try:
            block()
        finally:
            pgconn.untrace()
        trace.seek(0)
        lines = trace.read().splitlines()
    return sum(_asks(line.split("\t")) for line in lines)


def _asks(cells: list[str]) -> bool:
    """A trace line (``[timestamp]  F|B  length  message ...``) of a frontend message that asks
    for an answer."""
    for index in (0, 1):
        if cells[index : index + 1] == ["F"] and len(cells) > index + 2:
            return cells[index + 2] in ("Query", "Sync")
    return False


def heading(name: str, servers: dict[str, Any]) -> str:
    from django.db import connections

    if name == "postgres":
        shown = environment.postgres_settings(servers["postgres"])
        return (
            f"== PostgreSQL {shown['server_version']} (fsync {shown['fsync']}, "
            f"synchronous_commit {shown['synchronous_commit']}) =="
        )
    with connections["sqlite"].cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        (journal,) = cursor.fetchone()
        cursor.execute("PRAGMA synchronous")
        (synchronous,) = cursor.fetchone()
        cursor.execute("SELECT sqlite_version()")
        (version,) = cursor.fetchone()
    modes = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    return (
        f"== SQLite {version} (a file; journal_mode {journal}, synchronous "
        f"{modes.get(synchronous, synchronous)}, transaction_mode IMMEDIATE) =="
    )


@contextlib.contextmanager
def held_lock(alias: str) -> Iterator[Any]:
    """A lock of a database store on ``alias``, held for the block (renewed as usual)."""
    from django_locks import Locks
    from django_locks.stores import DatabaseStore

    store = DatabaseStore(using=alias)
    try:
        lock = Locks(store).acquire(f"bench:atomic:{alias}")
        if lock is None:
            raise RuntimeError("the atomic benchmark's key was taken")
        try:
            yield lock
        finally:
            lock.release()
    finally:
        store.close()


def run_store(name: str, servers: dict[str, Any], plan: AtomicPlan) -> dict[str, Any]:
    from django.db import connections

    alias = ALIASES[name]
    say(heading(name, servers))
    say()
    with held_lock(alias) as lock:
        probe = blocks(lock, alias, 0)
        counted = {form: statements(alias, probe[form]) for form in (PLAIN, LOCKED)}
        extra = counted[LOCKED] - counted[PLAIN]
        operations = blocks(lock, alias, extra)
        padded = padded_name(extra)
        counted[padded] = statements(alias, operations[padded])
        trips = (
            {form: round_trips(alias, block) for form, block in operations.items()}
            if name == "postgres"
            else {}
        )
        timed = latencies(operations, rounds=plan.rounds, block=plan.block, warmup=plan.warmup)
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT id, value FROM {TABLE} ORDER BY id")
        values = dict(cursor.fetchall())
    committed = dict(zip(operations, (values[1], values[2], values[3]), strict=True))
    # Each form ran once in statements() (the probe's, for the first two), once in
    # round_trips() on PostgreSQL, then in the warm-up and timed.
    runs = 1 + bool(trips) + plan.warmup + plan.rounds * plan.block
    expected = dict.fromkeys(operations, runs)
    plain = timed[PLAIN]

    def row(form: str) -> list[str]:
        value = timed[form]
        return [
            form,
            us(value.median),
            us(value.p99),
            ratio(value.median, plain.median),
            ratio(value.p99, plain.p99),
            us(value.cpu),
            str(counted[form]),
            *([str(trips[form])] if trips else []),
        ]

    say(
        f"A block of one UPDATE of a row, one thread ({plan.rounds} rounds of {plan.block}; "
        "ratios to the plain block's median / p99; client CPU per block, every thread's; "
        "statements: Django's in the block but BEGIN"
        + ("; round trips: counted in libpq's trace" if trips else "")
        + "):"
    )
    say(
        table(
            [
                "",
                "median",
                "p99",
                "x plain",
                "p99 x plain",
                "client CPU",
                "statements",
                *(["round trips"] if trips else []),
            ],
            [row(form) for form in operations],
        )
    )
    say(
        "  (rows written, one UPDATE a block: "
        + ", ".join(f"{committed[f]:,} of {expected[f]:,}" for f in operations)
        + ")"
    )
    say()
    figures: dict[str, Any] = {}
    for key, form in (("plain", PLAIN), ("atomic", LOCKED), ("padded", padded)):
        figures[key] = {
            **timed[form].as_dict(),
            "statements": counted[form],
            "committed": committed[form],
            "blocks_run": expected[form],
            **({"round_trips": trips[form]} if trips else {}),
        }
    locked, padding = timed[LOCKED], timed[padded]
    figures["ratio"] = round(locked.median / plain.median, 3)
    figures["p99_ratio"] = round(locked.p99 / plain.p99, 3)
    figures["padded_ratio"] = round(padding.median / plain.median, 3)
    return figures


def verdicts(stores: dict[str, Any]) -> list[dict[str, Any]]:
    figures = stores.get("postgres")
    if figures is None:
        return []
    plain, atomic = figures["plain"]["round_trips"], figures["atomic"]["round_trips"]
    limit = atomic / plain
    return [
        {
            "store": "postgres",
            "goal": (
                f"lock.atomic()'s median <= {atomic}/{plain} ({limit:.2f}x) the plain block's, "
                "the ratio of their round trips"
            ),
            "measured": f"{figures['ratio']:.2f}x (p99 {figures['p99_ratio']:.2f}x)",
            "met": figures["ratio"] <= limit,
        }
    ]


def main(*, quick: bool, stores: set[str] | None = None, pinned: bool = False) -> dict[str, Any]:
    """Measure ``stores`` (default: both of :data:`STORES`); the figures and the verdict."""
    plan = QUICK if quick else AtomicPlan()
    chosen = [name for name in STORES if stores is None or name in stores]
    results: dict[str, Any] = {"stores": {}}
    with tempfile.TemporaryDirectory(prefix="django_locks-atomic-") as folder:
        with environment.servers(set(chosen)) as servers:
            configure_django(servers.get("postgres"), os.path.join(folder, "atomic.sqlite3"))
            with placed(servers, pinned):
                for name in chosen:
                    results["stores"][name] = run_store(name, servers, plan)
    results["goals"] = verdicts(results["stores"])
    if results["goals"]:
        say("== Against the goal of issue 25 ==")
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
    else:
        say("(No goal on SQLite: the figures alone.)")
    return results
