"""A rolling upgrade with permits (SPEC sections 4, 9 and 12): processes of the first release
(0.1.0, which has no permits) and of the current tree on one PostgreSQL database and one Redis.
A key this release holds with permits is held to 0.1.0 (its own record, owner "permits"), until
its last permit ends; a key 0.1.0 holds with a plain lock refuses this release's permits
(``PermitsMismatchError``, nothing written); tokens keep growing across both; 0.1.0 lists a
table and a Redis holding slots; the migrations adding permits run while 0.1.0 keeps working."""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import django_locks
from tests.test_rolling_upgrade import (
    CHILD,
    PREVIOUS_VERSION,
    finish,
    launch,
    migrated_database,
    previous_release,
    steps,
)
from tests.venvs import run, user_env

__all__ = ["previous_release"]  # the fixture, shared with tests/test_rolling_upgrade.py

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.timeout(900),
]

CURRENT = Path(sys.executable)
CURRENT_VERSION = django_locks.__version__
TTL = 60_000


def empty_database(postgres_server: Any, name: str) -> dict[str, Any]:
    """A new, empty database ``name``; its ``DATABASES`` entry."""
    conn = postgres_server.connect()
    try:
        conn.cursor().execute(f"DROP DATABASE IF EXISTS {name}")
        conn.cursor().execute(f"CREATE DATABASE {name}")
    finally:
        conn.close()
    database: dict[str, Any] = postgres_server.database_settings(name)
    return database


class Releases:
    """Steps (``tests/children/rolling_upgrade.py steps``) run by a process of either release
    on one store."""

    def __init__(self, previous: Path, database: dict[str, Any], store: str, cwd: Path) -> None:
        self.previous_python = previous / "python"
        self.database = database
        self.store = store
        self.cwd = cwd

    def current(self, *actions: Any) -> Any:
        return steps(CURRENT, CURRENT_VERSION, self.database, self.store, self.cwd, *actions)

    def previous(self, *actions: Any) -> Any:
        python = self.previous_python
        return steps(python, PREVIOUS_VERSION, self.database, self.store, self.cwd, *actions)


@pytest.fixture(params=["postgres", "redis"])
def releases(
    request: pytest.FixtureRequest, previous_release: Path, postgres_server: Any, tmp_path: Path
) -> Releases:
    """Both releases on a PostgreSQL database migrated by this release (as a deploy does before
    its new processes start), or on the session's Redis (with an empty database: Django needs
    one)."""
    name = f"upgrade_permits_{request.node.name.partition('[')[0][-30:]}_{request.param}"
    if request.param == "postgres":
        database = migrated_database(postgres_server, name, tmp_path)
        return Releases(previous_release, database, "database", tmp_path)
    redis_server = request.getfixturevalue("redis_server")
    database = empty_database(postgres_server, name)
    return Releases(previous_release, database, f"redis={redis_server.url}", tmp_path)


def slot(key: str, permit: int) -> dict[str, Any]:
    return {"slot": [key, permit]}


def test_permits_of_this_release_hold_the_key_against_the_previous_release(
    releases: Releases,
) -> None:
    key = "upgrade:permits-held"
    # One permit, taken for 1.5 s and renewed for a minute: the key's own record follows it
    # (past the 1.5 s the old process would otherwise find the key free).
    first, renewed, _ = releases.current(
        ["acquire_permit", key, "p-1", 1500, 3],
        ["renew", slot(key, 1), "p-1", TTL],
        ["sleep", 1.6],
    )
    assert first[1] == 1 and renewed is True, (first, renewed)
    (refused_one,) = releases.previous(["acquire", key, "old-1", TTL])
    second, third, full = releases.current(
        ["acquire_permit", key, "p-2", TTL, 3],
        ["acquire_permit", key, "p-3", TTL, 3],
        ["acquire_permit", key, "p-4", TTL, 3],
    )
    assert [second[1], third[1]] == [2, 3], (second, third)
    assert isinstance(full, dict), full  # the holder of the slot ending first
    refused_three, not_released, listed, command = releases.previous(
        ["acquire", key, "old-2", TTL],
        ["release", key, "old-2"],
        ["leases"],
        ["locks_list"],
    )
    (gone_one,) = releases.current(["release", slot(key, 1), "p-1"])
    (refused_two,) = releases.previous(["acquire", key, "old-3", TTL])
    (gone_two,) = releases.current(["release", slot(key, 2), "p-2"])
    (refused_last,) = releases.previous(["acquire", key, "old-4", TTL])
    (gone_three,) = releases.current(["release", slot(key, 3), "p-3"])
    taken, released = releases.previous(
        ["acquire", key, "old-5", TTL],
        ["release", key, "old-5"],
    )
    after, _ = releases.current(
        ["acquire_permit", key, "p-5", TTL, 3], ["release", slot(key, 1), "p-5"]
    )

    # Whatever number of permits is held, the old process finds the key held; its release of
    # the key (it does not hold) frees nothing.
    assert [refused_one, refused_three, refused_two, refused_last] == [None] * 4
    assert not_released is False
    assert [gone_one, gone_two, gone_three] == [True] * 3
    tokens = [first[0], second[0], third[0]]
    assert len(set(tokens)) == 3, tokens
    # Every permit gone, the old process takes the key with a token above every permit's, and
    # this release's next permit comes above that.
    assert isinstance(taken, int) and taken > max(tokens), (taken, tokens)
    assert released is True
    assert after[0] > taken and after[1] == 1, (after, taken)

    # The old release's listing (its admin page and `manage.py locks list` read it) shows the
    # key held while its three permits are; `locks list` prints the same leases.
    states = {info["key"]: info["state"] for info in listed if info["key"].startswith(key)}
    assert states[key] == "held", listed
    assert {info["key"]: info["state"] for info in command if info["key"] in states} == states
    (record,) = [info for info in listed if info["key"] == key]
    assert record["owner"] == "permits", record
    slots = {name: info["fencing_token"] for info in listed if (name := info["key"]) in states}
    del slots[key]
    print("0.1.0 listed:", states, "slot tokens", slots, "the record", record)
    if releases.store == "database":  # one row per slot, as 0.1.0 reads any row
        assert slots == {f"{key}#{n}": token for n, token in enumerate(tokens, 1)}, listed
        assert {states[name] for name in slots} == {"held"}, listed


def test_a_plain_lock_of_the_previous_release_refuses_this_release_permits(
    releases: Releases,
) -> None:
    key = "upgrade:plain-held"
    token, renewed = releases.previous(["acquire", key, "old-1", TTL], ["renew", key, "old-1", TTL])
    assert isinstance(token, int) and renewed is True
    before, refused, service, record, first_slot, after = releases.current(
        ["leases"],
        ["acquire_permit", key, "p-1", TTL, 3],
        ["locks_acquire", key, 3],
        ["lease", key],
        ["lease", f"{key}#1"],
        ["leases"],
    )
    mismatch = {"raised": "PermitsMismatchError", "key": key, "permits": 3, "live": 1}
    assert refused == mismatch and service == mismatch, (refused, service)
    # Nothing written: the old lease as it was, no slot, the listing unchanged.
    assert (record["owner"], record["fencing_token"], record["state"]) == ("old-1", token, "held")
    assert record["permits"] is None, record
    assert first_slot is None, first_slot

    def unchanged(listing: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        names = ("key", "state", "owner", "fencing_token", "acquired_at", "permits", "permit")
        return [tuple(info[name] for name in names) for info in listing]

    assert unchanged(after) == unchanged(before), (before, after)
    # The old holder still holds it, and frees it.
    still, freed = releases.previous(["renew", key, "old-1", TTL], ["release", key, "old-1"])
    assert still is True and freed is True
    *grants, full, service_full = releases.current(
        ["acquire_permit", key, "p-1", TTL, 3],
        ["acquire_permit", key, "p-2", TTL, 3],
        ["acquire_permit", key, "p-3", TTL, 3],
        ["acquire_permit", key, "p-4", TTL, 3],
        ["locks_acquire", key, 3],
        *(["release", slot(key, n), f"p-{n}"] for n in (1, 2, 3)),
    )[:5]
    assert [grant[1] for grant in grants] == [1, 2, 3], grants
    assert min(grant[0] for grant in grants) > token, (grants, token)
    assert isinstance(full, dict) and service_full is None, (full, service_full)


def test_a_deploy_migrates_and_starts_permits_while_the_previous_release_runs(
    releases: Releases, postgres_server: Any, tmp_path: Path
) -> None:
    """On one key set: 0.1.0 processes loop plain acquire / hold / release; this release's
    migrations run under them (PostgreSQL: from the table 0.1.0 migrated); then this release's
    processes loop the same keys with permits=2. No old hold overlaps any other hold, no more
    than 2 permits of a key at once, tokens grow per slot and across the releases."""
    keys = ["upgrade:deploy-a", "upgrade:deploy-b", "upgrade:deploy-c"]
    previous_python = releases.previous_python
    database = releases.database
    if releases.store == "database":  # start over from what 0.1.0's own migrate left
        database = empty_database(postgres_server, "upgrade_permits_deploy")
        run(
            [previous_python, CHILD, "migrate", json.dumps(database), PREVIOUS_VERSION],
            cwd=tmp_path,
            env=user_env(),
        )
    old = [
        launch(
            tmp_path,
            f"previous-{n}",
            previous_python,
            PREVIOUS_VERSION,
            "contend",
            database,
            releases.store,
            "16",
            *keys,
        )
        for n in range(2)
    ]
    deadline = time.monotonic() + 60
    while not all(path.exists() and path.read_text() for _, path, _, _ in old):
        assert time.monotonic() < deadline, "the 0.1.0 processes never held a key"
        time.sleep(0.1)
    migrated = None
    if releases.store == "database":
        began = time.monotonic()
        run(
            [CURRENT, CHILD, "migrate", json.dumps(database), CURRENT_VERSION],
            cwd=tmp_path,
            env=user_env(),
        )
        migrated = (began, time.monotonic())
    new = [
        launch(
            tmp_path,
            f"current-{n}",
            CURRENT,
            CURRENT_VERSION,
            "contend-permits",
            database,
            releases.store,
            "7",
            "2",
            *keys,
        )
        for n in range(3)
    ]
    holds = finish(old + new, timeout=140, minimum=5)
    check_permits_beside_plain_locks(holds, keys, permits=2)
    if migrated is not None:
        old_holds = [hold for hold in holds if hold["release"] == "previous"]
        assert any(hold["end"] < migrated[0] for hold in old_holds), migrated
        assert any(hold["start"] > migrated[1] for hold in old_holds), migrated
        print(f"migrated in {migrated[1] - migrated[0]:.2f} s (the child process's whole run)")


def check_permits_beside_plain_locks(
    holds: list[dict[str, Any]], keys: list[str], permits: int
) -> None:
    """Per key: a plain hold (0.1.0) overlaps no other hold; overlapping permits hold distinct
    slots, at most ``permits`` at once; tokens are distinct and grow from a hold to the next
    one it excludes (any hold after a plain one, or after the same slot's)."""
    assert all(hold["held"] and hold["released"] for hold in holds), [
        hold for hold in holds if not (hold["held"] and hold["released"])
    ]
    handovers = most = 0
    for key in keys:
        mine = sorted((hold for hold in holds if hold["key"] == key), key=lambda h: h["start"])
        assert len({hold["token"] for hold in mine}) == len(mine), ("duplicate tokens", key)
        for before, after in itertools.combinations(mine, 2):
            plain = "permit" not in before or "permit" not in after
            if before["end"] > after["start"]:  # overlapping
                assert not plain, ("a plain hold overlapped another", before, after)
                assert before["permit"] != after["permit"], ("one slot twice", before, after)
            elif plain or before["permit"] == after["permit"]:
                assert before["token"] < after["token"], ("token did not grow", before, after)
        for hold in mine:
            at_once = [h for h in mine if h["start"] <= hold["start"] < h["end"]]
            assert len(at_once) <= permits, ("over the permits", at_once)
            most = max(most, len(at_once))
        handovers += sum(
            ("permit" in before) != ("permit" in after)
            for before, after in itertools.pairwise(mine)
        )
    kinds = {"permit" in hold for hold in holds}
    assert kinds == {True, False}, "only one release held keys"
    assert handovers >= 3, f"only {handovers} handovers between plain locks and permits"
    print(f"{len(holds)} holds, {handovers} handovers between plain locks and permits, ", end="")
    print(f"at most {most} permits of one key held at once")
