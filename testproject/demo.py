"""The shop, for real: three instances, one export per tick, and a takeover when the owner dies.

``make demo`` (or ``python testproject/demo.py``) runs it on what needs no server: SQLite (a file
in a temporary directory), the default database store, and kombu's filesystem transport as the
Celery broker. ``--servers`` runs the same on PostgreSQL and Redis (the broker, and the lock store
unless ``--store database``): with ``SHOP_DATABASE_URL`` (an empty database) and ``SHOP_REDIS_URL``
set it uses those, otherwise it starts throwaway servers as the test suite does (``initdb`` and
``redis-server`` on PATH or in the usual places).

Each instance is what a replica of the shop runs: ``celery worker -B`` (a worker with its beat)
and ``manage.py run_leader inventory:warehouse-feed``. The demo places orders, watches the ticks,
clicks "Export now" in the admin, kills the instance owning the export, and stops another the way
a deploy does. Every step checks its outcome; the demo exits 1 when one is wrong, with the
instances' logs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    # `python testproject/demo.py` puts testproject/ first on sys.path: the project's root instead.
    sys.path[:1] = [str(ROOT)]

TTL = 3.0
"""The demo's ttl (settings: SHOP_DEMO=1), seconds."""
EXPORT_EVERY = 2.0
"""The export's interval in the demo's beat schedule, seconds."""
INSTANCES = ("shop-1", "shop-2", "shop-3")


class DemoFailed(Exception):
    pass


def say(text: str = "") -> None:
    print(text, flush=True)


def check(condition: bool, failure: str) -> None:
    if not condition:
        raise DemoFailed(failure)


def wait_for(predicate: Callable[[], Any], *, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise DemoFailed(f"not after {timeout:g}s: {what}")
        time.sleep(0.1)


def clock(timestamp: float | str | None) -> str:
    if isinstance(timestamp, str):
        timestamp = datetime.datetime.fromisoformat(timestamp).timestamp()
    moment = datetime.datetime.fromtimestamp(timestamp or 0)
    return moment.strftime("%H:%M:%S.") + f"{moment.microsecond // 100_000}"


# The servers of --servers.


@contextlib.contextmanager
def servers(store: str) -> Iterator[dict[str, str]]:
    """The environment of a demo on PostgreSQL and Redis, from env vars or throwaway servers."""
    env = {"SHOP_LOCKS_STORE": store}
    started: list[Any] = []
    try:
        if os.environ.get("SHOP_DATABASE_URL"):
            env["SHOP_DATABASE_URL"] = os.environ["SHOP_DATABASE_URL"]
        else:
            from tests.servers.postgres import SUPERUSER, PostgresServer

            say("Starting a throwaway PostgreSQL...")
            postgres = PostgresServer().start()
            started.append(postgres)
            conn = postgres.connect()
            conn.cursor().execute("CREATE DATABASE shop")
            conn.close()
            env["SHOP_DATABASE_URL"] = f"postgresql://{SUPERUSER}@127.0.0.1:{postgres.port}/shop"
        if os.environ.get("SHOP_REDIS_URL"):
            env["SHOP_REDIS_URL"] = os.environ["SHOP_REDIS_URL"]
        else:
            from tests.servers.redis import RedisServer

            say("Starting a throwaway redis-server...")
            redis = RedisServer().start()
            started.append(redis)
            env["SHOP_REDIS_URL"] = redis.url
        yield env
    finally:
        for server in reversed(started):
            server.destroy()


# The instances.


class Instance:
    """One replica of the shop: a Celery worker with its beat, and run_leader, in one process
    group (so that killing the instance kills all of it, as losing the machine would)."""

    def __init__(self, name: str, data: Path, env: dict[str, str]) -> None:
        self.name = name
        self.data = data
        self.env = {**env, "SHOP_INSTANCE": name}
        self.processes: list[subprocess.Popen[bytes]] = []
        self.logs = [data / f"{name}-worker.log", data / f"{name}-leader.log"]

    def start(self) -> None:
        python = sys.executable
        worker = [
            *(python, "-m", "celery", "-A", "testproject.celery_app", "worker", "-B"),
            *("-P", "solo", "-n", f"{self.name}@%h", "-l", "INFO"),
            *("-s", str(self.data / f"{self.name}-beat-schedule")),
            *("--without-gossip", "--without-mingle", "--without-heartbeat"),
        ]
        leader = [python, "-m", "django", "run_leader", "inventory:warehouse-feed", "--grace=3s"]
        first = self._spawn(worker, self.logs[0], process_group=0)
        self._spawn(leader, self.logs[1], process_group=first.pid)

    def _spawn(self, args: list[str], log: Path, **kwargs: Any) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            process = subprocess.Popen(
                args, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT, **kwargs
            )
        self.processes.append(process)
        return process

    @property
    def group(self) -> int:
        return self.processes[0].pid

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.group, signum)

    def stop(self, timeout: float = 10) -> bool:
        """SIGTERM (a deploy), then SIGKILL what is left after ``timeout``; whether all exited."""
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        clean = True
        for process in self.processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                clean = False
        self.signal(signal.SIGKILL)
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)
        return clean

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        for process in self.processes:
            process.wait(10)

    def alive(self) -> bool:
        return all(process.poll() is None for process in self.processes)

    def log_tail(self, lines: int = 25) -> str:
        parts = []
        for log in self.logs:
            text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
            parts.append(f"--- {log.name} ---\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(parts)


class Demo:
    def __init__(self, data: Path, env: dict[str, str], label: str) -> None:
        self.data = data
        self.env = env
        self.label = label
        self.instances = [Instance(name, data, env) for name in INSTANCES]
        self.groups: dict[int, str] = {}
        self.orders = 0
        self.last_order = 0.0
        self.started = time.monotonic()

    # What happened, read from the outside systems and the database.

    def instance_of(self, holder: str | None) -> str:
        """The instance a "host:pid" belongs to (its process group); "?" when unknown."""
        if not holder:
            return "?"
        pid = int(holder.rsplit(":", 1)[1])
        if pid not in self.groups:
            try:
                group = os.getpgid(pid)
            except ProcessLookupError:
                return "?"
            names = {instance.group: instance.name for instance in self.instances}
            self.groups[pid] = names.get(group, "?")
        return self.groups[pid]

    def exports(self, source: str = "beat") -> list[dict[str, Any]]:
        from testproject.clients import AccountingClient

        return [batch for batch in AccountingClient().batches() if batch["source"] == source]

    def place_orders(self) -> None:
        """An order (and its invoice) every 0.7 s, as customers do."""
        from testproject.invoices.models import Invoice, Order

        if time.monotonic() - self.last_order < 0.7:
            return
        self.last_order = time.monotonic()
        self.orders += 1
        order = Order.objects.create(customer=f"customer {self.orders}", total=12 * self.orders)
        Invoice.objects.create(order=order, number=f"INV-{self.orders:04d}", amount=order.total)

    def watch_exports(self, count: int, *, timeout: float, after: int = 0) -> list[dict[str, Any]]:
        """Print each beat-published export as it reaches accounting, until ``count`` more."""
        shown = len(self.exports())
        deadline = time.monotonic() + timeout
        while len(self.exports()) < after + count:
            self.place_orders()
            for batch in self.exports()[shown:]:
                self.show_export(batch)
            shown = len(self.exports())
            check(time.monotonic() < deadline, f"fewer than {count} exports in {timeout:g}s")
            time.sleep(0.1)
        for batch in self.exports()[shown:]:
            self.show_export(batch)
        return self.exports()

    def show_export(self, batch: dict[str, Any]) -> None:
        invoices = len(batch["invoices"])
        say(
            f"   {clock(batch['scheduled'])}  tick published by {self.instance_of(batch['beat'])}'s"
            f" beat, run by {self.instance_of(batch['worker'])}'s worker: {invoices} invoice"
            f"{'s' if invoices != 1 else ''} sent, run token {batch['fencing_token']}"
        )

    def owner(self, key: str) -> tuple[str, int] | None:
        """The instance holding ``key`` and its token, from the store's leases."""
        from django_locks import locks

        for lease in locks.store.leases():
            if lease.key == key and lease.state == "held":
                return self.instance_of(lease.described.address), lease.fencing_token
        return None

    def feed(self) -> list[tuple[str, int]]:
        from testproject.inventory.models import StockAlert

        alerts = StockAlert.objects.order_by("position").values_list("leader", "fencing_token")
        return [(self.instance_of(leader), token) for leader, token in alerts]

    # The steps.

    def run(self) -> None:
        from django.core.management import call_command

        from testproject.inventory.models import Product

        call_command("migrate", verbosity=0)
        for sku, name in [("mug", "Mug"), ("tee", "T-shirt"), ("cap", "Cap")]:
            Product.objects.create(sku=sku, name=name, in_stock=10)
        say(f"The shop on {self.label}; ttl {TTL:g}s, export every {EXPORT_EVERY:g}s.")
        say("Starting shop-1, shop-2, shop-3, each: celery worker -B, and run_leader.")
        for instance in self.instances:
            instance.start()
        self.ticks()
        self.fencing()
        self.leader()
        self.export_now()
        self.kill_the_owner()
        self.deploy()
        self.summary()

    def ticks(self) -> None:
        say("\n1. The nightly export (every 2 s here): three beats, one publishes each tick.")

        def first_export() -> list[dict[str, Any]]:
            self.place_orders()
            return self.exports()

        wait_for(
            first_export,
            timeout=45,
            what="the first export (the instances did not start?)",
        )
        say(f"   (the instances were up after {time.monotonic() - self.started:.1f}s)")
        runs = self.watch_exports(3, timeout=20, after=1)
        owner = self.owner("invoices:nightly-export:owner")
        check(owner is not None, "no beat holds the export's owner lease")
        assert owner is not None
        self.check_once_per_tick(runs)
        others = ", ".join(i.name for i in self.instances if i.name != owner[0])
        say(f"   -> one export per tick: {owner[0]}'s beat owns the job, {others} skip it.")

    def check_once_per_tick(self, runs: list[dict[str, Any]]) -> None:
        ticks = [datetime.datetime.fromisoformat(run["scheduled"]).timestamp() for run in runs]
        check(len(set(ticks)) == len(ticks), "a tick was exported twice")
        gaps = [b - a for a, b in itertools.pairwise(ticks)]
        check(all(gap > EXPORT_EVERY * 0.6 for gap in gaps), f"two exports for one tick: {gaps}")
        sent = [
            i["number"]
            for run in self.exports("beat") + self.exports("admin")
            for i in run["invoices"]
        ]
        check(len(sent) == len(set(sent)), "an invoice was sent to accounting twice")

    def fencing(self) -> None:
        from django_locks.fencing import fenced_update
        from testproject.inventory.models import Product, Reconciliation

        say("\n2. The stock reconciliation (every 3 s here) writes stock with its run's token.")
        runs = wait_for(
            lambda: (
                list(Reconciliation.objects.order_by("pk")[:2])
                if (Reconciliation.objects.count() >= 2)
                else None
            ),
            timeout=15,
            what="two reconciliation runs",
        )
        tokens = [run.fencing_token for run in runs]
        check(all(run.written == 3 for run in runs), "a run did not write every product")
        check(tokens[1] > tokens[0], f"the runs' tokens did not grow: {tokens}")
        say(f"   two runs, tokens {tokens[0]} and {tokens[1]}, each wrote every product once.")
        written = fenced_update(Product.objects.all(), tokens[0], in_stock=-1)
        check(written == 0, "a late write with an older token was accepted")
        stock = Product.objects.order_by("sku").values_list("sku", "in_stock", "stock_token")
        say("   now: " + ", ".join(f"{sku} {count} (token {token})" for sku, count, token in stock))
        say(f"   a late write with token {tokens[0]} (a run that paused): {written} rows changed.")

    def leader(self) -> None:
        say("\n3. The warehouse alert feed: run_leader on every instance, one leads.")
        alerts = wait_for(lambda: len(self.feed()) >= 3 and self.feed(), timeout=20, what="alerts")
        leaders = {name for name, _ in alerts}
        check(len(leaders) == 1, f"several leaders read the feed: {leaders}")
        say(f"   {alerts[-1][0]} leads (token {alerts[-1][1]}); {len(alerts)} alerts so far.")

    def export_now(self) -> None:
        from django.contrib.auth.models import User
        from django.test import Client

        from django_locks import locks

        say("\n4. An admin clicks 'Export now' while an export runs (the demo holds its lock).")
        client = Client()
        client.force_login(User.objects.create_superuser("admin", "admin@example.com", "admin"))
        url = "/admin/invoices/invoice/export-now/"
        with locks.lock("invoices:nightly-export", wait="10s"):
            started = time.monotonic()
            response = client.post(url)
            took = time.monotonic() - started
        say(f"   after {took:.1f}s: {response.status_code} {response.content.decode()}")
        check(response.status_code == 409 and took >= 2, "expected a 409 after waiting 2 s")
        self.last_order = 0
        self.place_orders()
        response = client.post(url)
        say(f"   once it is done: {response.status_code} {response.content.decode()}")
        check(response.status_code == 200, "expected the export to run")

    def kill_the_owner(self) -> None:
        say("\n5. The instance owning the export dies.")
        owner = self.owner("invoices:nightly-export:owner")
        check(owner is not None, "no beat holds the export's owner lease")
        assert owner is not None
        feed_before = self.feed()[-1]
        victim = next(i for i in self.instances if i.name == owner[0])
        before = len(self.exports())
        victim.kill()
        killed_at = time.time()
        say(f"   {clock(killed_at)}  SIGKILL {victim.name}: its worker, beat and run_leader")
        runs = self.watch_exports(3, timeout=6 * TTL + 10, after=before)
        after_kill = [run for run in runs[before:] if run["beat"] != runs[before - 1]["beat"]]
        check(bool(after_kill), "no other beat took the export over")
        took = datetime.datetime.fromisoformat(after_kill[0]["scheduled"]).timestamp() - killed_at
        new_owner = self.instance_of(after_kill[0]["beat"])
        check(new_owner != victim.name, "the dead instance published a tick")
        check(took < TTL + 2 * EXPORT_EVERY + 2, f"the takeover took {took:.1f}s")
        self.check_once_per_tick(runs[before:])
        say(f"   -> {new_owner}'s beat took the export over {took:.1f}s after the kill.")
        if feed_before[0] == victim.name:
            alerts = wait_for(
                lambda: [a for a in self.feed() if a[1] > feed_before[1]],
                timeout=4 * TTL,
                what="a new leader of the feed",
            )
            say(f"   -> {alerts[0][0]} leads the feed now (token {alerts[0][1]}).")

    def deploy(self) -> None:
        leader, token = self.feed()[-1]
        say(f"\n6. A deploy restarts {leader}'s run_leader (SIGTERM): it hands the feed back.")
        instance = next(i for i in self.instances if i.name == leader)
        run_leader = instance.processes[1]
        stopped_at = time.monotonic()
        run_leader.send_signal(signal.SIGTERM)
        try:
            code = run_leader.wait(10)
        except subprocess.TimeoutExpired:
            code = None
        check(code == 0, f"{leader}'s run_leader did not exit 0 within 10 s: {code}")
        alerts = wait_for(
            lambda: [a for a in self.feed() if a[1] > token],
            timeout=4 * TTL,
            what="a new leader after the clean stop",
        )
        took = time.monotonic() - stopped_at
        check(alerts[0][0] != leader, f"{leader} leads, but its run_leader was stopped")
        say(f"   -> {alerts[0][0]} leads the feed {took:.1f}s later (token {alerts[0][1]}).")

    def summary(self) -> None:
        from testproject.invoices.models import Invoice

        runs = self.exports()
        self.check_once_per_tick(runs)
        sent = [i["number"] for batch in runs + self.exports("admin") for i in batch["invoices"]]
        invoices = Invoice.objects.count()
        exported = Invoice.objects.exclude(exported_at=None).count()
        say(
            f"\nChecked: {len(runs)} ticks, {len(runs)} exports, never two for a tick; "
            f"{len(sent)} of {invoices} invoices sent, none twice ({exported} marked exported)."
        )

    def stop_all(self) -> None:
        threads = [
            threading.Thread(target=instance.stop, args=(5,))
            for instance in self.instances
            if instance.processes
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", action="store_true", help="PostgreSQL and Redis")
    parser.add_argument(
        "--store",
        choices=["redis", "database"],
        default="redis",
        help="with --servers: where the locks live (default: redis)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the data directory and logs")
    options = parser.parse_args(argv)
    started = time.monotonic()
    data = Path(tempfile.mkdtemp(prefix="shop-demo-"))
    with contextlib.ExitStack() as stack:
        env = {}
        if options.servers:
            env = stack.enter_context(servers(options.store))
            where = "the Redis store" if options.store == "redis" else "the database store"
            label = f"PostgreSQL, with {where}, Redis as the broker"
        else:
            label = "SQLite with the database store, a filesystem broker"
        env.update(
            SHOP_DATA_DIR=str(data), SHOP_DEMO="1", DJANGO_SETTINGS_MODULE="testproject.settings"
        )
        os.environ.update(env)
        child_env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}

        import django

        django.setup()
        # The instances log to their files; here, only what goes wrong.
        for name in ("django_locks", "shop", "django.request"):
            logging.getLogger(name).setLevel(logging.ERROR)
        demo = Demo(data, child_env, label)
        try:
            demo.run()
        except Exception as exc:
            if not isinstance(exc, DemoFailed):
                traceback.print_exc()
            say(f"\nDEMO FAILED: {exc}")
            for instance in demo.instances:
                say(instance.log_tail())
            return 1
        finally:
            demo.stop_all()
            from django.db import connections

            from django_locks import locks

            locks.store.close()
            connections.close_all()
            if options.keep:
                say(f"(data and logs kept in {data})")
            else:
                import shutil

                shutil.rmtree(data, ignore_errors=True)
    say(f"Demo finished in {time.monotonic() - started:.0f}s: every outcome as expected.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
