"""``manage.py locks list|release`` of keys taken with permits, through call_command on real
stores (in-memory, SQLite, PostgreSQL, Redis): each slot listed with ``permit n/N``, the key's
own record as its summary (``N permits, k held``, no holder), ``--json`` and ``--watch`` with
the same rows; ``release KEY`` of the key frees every slot and says how many, of a slot that
permit alone."""

from __future__ import annotations

import getpass
import io
import json
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from django_locks.holders import Holder
from django_locks.service import locks
from django_locks.stores.base import LockStore, PermitGrant

pytestmark = pytest.mark.django_db(transaction=True)
ON_POSTGRES = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "postgres"]),
]
KEY = "cli:permits"
SLOTS = [f"{KEY}#1", f"{KEY}#2", f"{KEY}#3"]


@pytest.fixture(
    params=[
        "memory",
        "sqlite",
        pytest.param("postgres", marks=ON_POSTGRES),
        pytest.param("redis", marks=pytest.mark.redis),
    ]
)
def store(settings: Any, request: pytest.FixtureRequest) -> Iterator[LockStore]:
    """Each store offering permits in turn, configured as the project's store, with three of
    the five permits of :data:`KEY` held and one plain lock."""
    if request.param == "memory":
        settings.LOCKS = {
            "BACKEND": "django_locks.stores.InMemoryStore",
            "ALLOW_IN_MEMORY_STORAGE": True,
        }
    elif request.param == "sqlite":
        settings.LOCKS = {"BACKEND": "django_locks.stores.DatabaseStore"}
    elif request.param == "postgres":
        request.getfixturevalue("postgres_server")
        settings.LOCKS = {
            "BACKEND": "django_locks.stores.DatabaseStore",
            "OPTIONS": {"using": "postgres"},
        }
    else:
        url = request.getfixturevalue("redis_server").url
        settings.LOCKS = {"BACKEND": "django_locks.stores.RedisStore", "OPTIONS": {"url": url}}
    store = locks.store
    assert store.supports_permits, f"{store} offers no permits"
    store.clear()
    for n in range(3):
        holder = Holder(host="web-2", pid=4121 + n, kind="command", detail=f"export-{n}")
        grant = store.acquire_permit(KEY, f"secret-owner-{n}", 60_000, 5, holder)
        assert isinstance(grant, PermitGrant) and grant.permit == n + 1
    assert isinstance(store.acquire("cli:plain", "secret-owner-plain", 60_000), int)
    yield store
    store.clear()
    store.close()


def run(*args: str, stdin: str | None = None) -> str:
    out = io.StringIO()
    options: dict[str, Any] = {"stdout": out, "stderr": io.StringIO()}
    if stdin is not None:
        options["stdin"] = io.StringIO(stdin)
    call_command("locks", *args, **options)
    return out.getvalue()


def table(out: str) -> dict[str, list[str]]:
    """``locks list``'s rows by key: each row's cells (two spaces or more apart)."""
    lines = out.splitlines()
    header = re.split(r"\s{2,}", lines[0])
    assert header[:3] == ["KEY", "PERMITS", "STATE"], header
    return {cells[0]: cells for cells in (re.split(r"\s{2,}", line) for line in lines[1:])}


def held(store: LockStore) -> set[str]:
    return {lease.key for lease in store.leases()}


def test_list_shows_each_slot_and_the_keys_summary(store):
    rows = table(run("list"))
    assert set(rows) == {KEY, *SLOTS, "cli:plain"}
    assert rows[KEY][1:4] == ["5 permits, 3 held", "held", "-"]  # no holder
    assert rows[f"{KEY}#2"][1:4] == ["permit 2/5", "held", "web-2 pid 4122 (command export-1)"]
    assert rows["cli:plain"][1:3] == ["-", "held"]
    assert "secret-owner" not in run("list") and " permits pid " not in run("list")


def test_list_json_describes_slots_and_summaries(store):
    listed = {lease["key"]: lease for lease in json.loads(run("list", "--json"))}
    summary, slot, plain = listed[KEY], listed[f"{KEY}#3"], listed["cli:plain"]
    assert (summary["permits"], summary["held_permits"], summary["permit"]) == (5, 3, None)
    assert summary["holder"] is None and summary["holder_info"] is None
    assert (slot["permit"], slot["permits"], slot["base_key"], slot["held_permits"]) == (
        3,
        5,
        KEY,
        None,
    )
    assert slot["holder_info"]["pid"] == 4123
    assert (plain["permit"], plain["permits"], plain["base_key"]) == (None, None, None)


def test_release_of_the_key_frees_every_permit_and_says_how_many(store, caplog):
    with caplog.at_level(logging.WARNING, logger="django_locks"):
        out = run("release", KEY, stdin="y\n")
    assert f"Release '{KEY}' (5 permits, 3 held: every permit of the key;" in out
    assert "Each holder is told at its next renewal" in out
    assert f"Released '{KEY}': every permit (3 permits) of the key freed" in out
    assert held(store) == {"cli:plain"}
    [line] = [r.getMessage() for r in caplog.records if "locks release" in r.getMessage()]
    assert "every permit of the key: 5 permits, 3 permits held" in line
    assert getpass.getuser() in line and "secret-owner" not in caplog.text
    if store.keeps_ended_leases:
        ended = {lease.key: lease for lease in store.leases(include_inactive=True)}
        assert {ended[slot].ended for slot in SLOTS} == {"force released"}
        assert ended[SLOTS[0]].ended_by and ended[SLOTS[0]].ended_by.startswith("cli ")


def test_release_of_a_slot_frees_that_permit_alone(store):
    out = run("release", f"{KEY}#2", "--yes")
    assert f"Released '{KEY}#2' (permit 2/5 of '{KEY}', held by web-2 pid 4122" in out
    assert held(store) == {KEY, f"{KEY}#1", f"{KEY}#3", "cli:plain"}
    assert table(run("list"))[KEY][1] == "5 permits, 2 held"
    with pytest.raises(CommandError, match="No live lease"):
        run("release", f"{KEY}#2", "--yes")


def test_watch_shows_the_same_rows(store):
    """``list --watch`` until Ctrl-C (a SIGINT to this process once a refresh is out)."""
    out = io.StringIO()

    def interrupt() -> None:
        deadline = time.monotonic() + 20
        while "5 permits, 3 held" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    stopper = threading.Thread(target=interrupt)
    stopper.start()
    call_command("locks", "list", "--watch", stdout=out, stderr=io.StringIO())
    stopper.join()
    block = out.getvalue().split("\n\n")[0]
    header, *lines = block.splitlines()
    assert header.endswith(": 4 held leases (every 1s, Ctrl-C to stop)"), header  # no summary
    watched, listed = table("\n".join(lines)), table(run("list"))
    # The same rows and cells, but how long each lease has left.
    assert {k: v[:-1] for k, v in watched.items()} == {k: v[:-1] for k, v in listed.items()}
