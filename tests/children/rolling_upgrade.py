"""A process of the rolling-upgrade test (tests/test_rolling_upgrade.py), run by the previous
release's virtualenv or by the current tree's.

Run as a script (``python tests/children/rolling_upgrade.py ...``), never with ``-m``: the
script's own directory is then the first entry of ``sys.path``, not the checkout, so
``import django_locks`` finds the release installed in the interpreter's environment.

    rolling_upgrade.py migrate DATABASE_JSON VERSION
    rolling_upgrade.py contend DATABASE_JSON VERSION STORE OUT SECONDS KEYS...
    rolling_upgrade.py contend-permits DATABASE_JSON VERSION STORE OUT SECONDS PERMITS KEYS...
    rolling_upgrade.py steps DATABASE_JSON VERSION STORE STEPS_JSON

``contend`` loops acquire / hold / release on the shared KEYS for SECONDS on the ``database`` or
``redis`` STORE (a Redis URL follows ``redis=``) and writes one JSON line per hold to OUT: key,
fencing token, start and end (``time.monotonic()``, one clock for every process of the machine).
``contend-permits`` (this release's only) does the same with ``permits=PERMITS``, each line with
the permit held; a key another process holds with a plain lock (``PermitsMismatchError``) is
tried again a moment later.

``steps`` calls the STORE's methods one after the other, each step a JSON list of the
method's name and its arguments (``["renew", KEY, OWNER, TTL_MS]``; ``["acquire_as", KEY, OWNER,
TTL_MS, KIND, DETAIL]`` describes this process with KIND and DETAIL; ``["acquire_permit", KEY,
OWNER, TTL_MS, PERMITS]``; ``["locks_acquire", KEY, PERMITS]``: the service's ``acquire``, its
lock released when the steps end; ``["locks_list"]``: ``manage.py locks list --all --json``;
``["sleep", SECONDS]``; ``["address"]``: this process's ``host:pid``; ``lease`` and ``leases``
list ended leases too). An argument ``{"slot": [KEY, N]}`` is the ``Slot`` of permit N of KEY.
A step raising a ``LocksError`` answers ``{"raised": NAME, ...its attributes}``. The results
are printed as one JSON list (dataclasses as dicts, datetimes and durations as strings).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import random
import socket
import sys
import time
from typing import Any


def setup(database: dict[str, Any], version: str, store_name: str = "database") -> None:
    import django
    from django.conf import settings

    # LOCKS names the same store as make_store, for the steps that go through the service
    # (``manage.py locks``).
    if store_name == "database":
        configured: dict[str, Any] = {"BACKEND": "django_locks.stores.DatabaseStore"}
    else:
        url = store_name.removeprefix("redis=")
        configured = {"BACKEND": "django_locks.stores.RedisStore", "OPTIONS": {"url": url}}
    settings.configure(
        DEBUG=False,
        SECRET_KEY="upgrade-test",
        USE_TZ=True,
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_locks"],
        DATABASES={"default": database},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        LOCKS=configured,
    )
    django.setup()
    import django_locks

    # The release under test, not whatever happens to be on sys.path.
    if django_locks.__version__ != version:
        raise SystemExit(f"expected django_locks {version}, imported {django_locks.__version__}")


def migrate() -> None:
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def contend(store_name: str, out: str, seconds: float, keys: list[str], permits: int = 1) -> None:
    from django_locks import Locks
    from django_locks.exceptions import LocksError

    store = make_store(store_name)
    # One hold of each process outlives the ttl: the background renewer keeps it.
    service = Locks(store, ttl="3s")
    rng = random.Random()
    began = time.monotonic()
    deadline = began + seconds
    long_hold_due = True
    holds = 0
    with open(out, "w") as fh:
        while time.monotonic() < deadline:
            key = rng.choice(keys)
            if permits == 1:  # the only form 0.1.0 has
                lock = service.acquire(key, wait="2s")
            else:
                try:
                    lock = service.acquire(key, wait="2s", permits=permits)
                except LocksError as exc:
                    if type(exc).__name__ != "PermitsMismatchError":
                        raise
                    time.sleep(rng.uniform(0.005, 0.03))  # a plain lock holds it: try again
                    continue
            if lock is None:
                continue  # the other processes kept it for two seconds: fine, try again
            start = time.monotonic()
            if long_hold_due and start > began + 1:
                long_hold_due = False
                time.sleep(3.5)
            else:
                time.sleep(rng.uniform(0.005, 0.03))
            end = time.monotonic()
            held = lock.held
            released = lock.release()
            record = {
                "key": key,
                "token": lock.fencing_token,
                "start": start,
                "end": end,
                "held": held,
                "released": released,
            }
            if permits > 1:
                record["permit"] = lock.permit
            fh.write(json.dumps(record) + "\n")
            holds += 1
    if not holds:
        raise SystemExit("no hold at all in the whole run")
    store.close()


def make_store(store_name: str) -> Any:
    from django_locks.stores import DatabaseStore, RedisStore

    if store_name == "database":
        return DatabaseStore(using="default")
    return RedisStore(url=store_name.removeprefix("redis="))


def steps(store_name: str, actions: list[list[Any]]) -> None:
    from django_locks.exceptions import LocksError

    store = make_store(store_name)
    held: list[Any] = []  # the service's locks, released at the end
    results: list[Any] = []
    for name, *args in actions:
        try:
            results.append(step(store, held, name, [argument(arg) for arg in args]))
        except LocksError as exc:
            results.append({"raised": type(exc).__name__, **vars(exc)})
    for lock in held:
        lock.release()
    store.close()
    print(json.dumps([plain(result) for result in results], default=str))


def step(store: Any, held: list[Any], name: str, args: list[Any]) -> Any:
    if name == "sleep":
        time.sleep(args[0])
        return None
    if name == "address":
        return f"{socket.gethostname()}:{os.getpid()}"
    if name in ("acquire_as", "acquire_permit"):  # this release's only
        from django_locks.holders import this_process

        if name == "acquire_as":
            key, owner, ttl_ms, kind, detail = args
            holder = dataclasses.replace(this_process(), kind=kind, detail=detail)
            return store.acquire_as(key, owner, ttl_ms, holder)
        key, owner, ttl_ms, permits = args
        return store.acquire_permit(key, owner, ttl_ms, permits, this_process())
    if name == "locks_acquire":  # this release's only
        from django_locks import Locks

        key, permits = args
        lock = Locks(store, ttl="30s").acquire(key, permits=permits)
        if lock is None:
            return None
        held.append(lock)
        return {"token": lock.fencing_token, "permit": lock.permit}
    if name == "locks_list":
        from django.core.management import call_command

        out = io.StringIO()
        call_command("locks", "list", "--all", "--json", stdout=out)
        return json.loads(out.getvalue())
    if name in ("lease", "leases"):  # ended leases too
        return getattr(store, name)(*args, include_inactive=True)
    return getattr(store, name)(*args)


def argument(value: Any) -> Any:
    """``{"slot": [KEY, N]}`` as the ``Slot`` this release's service would pass."""
    if isinstance(value, dict) and set(value) == {"slot"}:
        from django_locks.stores.base import Slot

        return Slot(*value["slot"])
    return value


def plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field: plain(item) for field, item in dataclasses.asdict(value).items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


def main(argv: list[str]) -> None:
    command, database, version = argv[0], json.loads(argv[1]), argv[2]
    setup(database, version, *argv[3:4])
    if command == "migrate":
        migrate()
    elif command == "contend":
        contend(argv[3], argv[4], float(argv[5]), argv[6:])
    elif command == "contend-permits":
        contend(argv[3], argv[4], float(argv[5]), argv[7:], permits=int(argv[6]))
    elif command == "steps":
        steps(argv[3], json.loads(argv[4]))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
