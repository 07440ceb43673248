"""A rolling upgrade (SPEC section 9): processes of the first release (0.1.0, built from this
repository's own history) and of the current tree contend on one PostgreSQL database, after the
current migrations, and on one Redis. Neither fails; neither takes a key the other holds. A lease
a 0.1.0 process took shows held / expired with no end reason, described only as what 0.1.0
records (a "process" at its address), never with what an earlier lease of the key left behind."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import pytest

import django_locks
from tests.venvs import ROOT, build_dists, make_venv, run, user_env

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.timeout(900),
]

PREVIOUS_COMMIT = "e6af6cb"
"""The first release, 0.1.0: what main pointed to before the robustness issue's first commit."""
PREVIOUS_VERSION = "0.1.0"
CHILD = ROOT / "tests" / "children" / "rolling_upgrade.py"
KEYS = ["upgrade:a", "upgrade:b", "upgrade:c"]
SECONDS = 8.0
PROCESSES_PER_RELEASE = 2
CURRENT = Path(sys.executable)


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv with the wheel of 0.1.0 (its distribution was still ``django-locks``),
    built from ``git archive`` of its commit; its ``bin`` directory."""
    base = tmp_path_factory.mktemp("previous-release")
    source = base / "source"
    source.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", PREVIOUS_COMMIT],
        capture_output=True,
        check=True,
        timeout=120,
    )
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
    _, wheel = build_dists(source, base / "dist")
    assert wheel.name.startswith(f"django_locks-{PREVIOUS_VERSION}-"), wheel.name
    return make_venv(base / "venv", [f"{wheel}[postgres,redis]"])


Child = tuple[str, Path, subprocess.Popen[bytes], IO[str]]
"""A running process of ``launch``: its release, its holds' file, the process, its log."""


def launch(
    out: Path,
    name: str,
    python: Path,
    version: str,
    command: str,
    database: dict[str, Any],
    store: str,
    *args: str,
) -> Child:
    """Start ``command`` (``contend``, ``contend-permits``) of the child under ``python`` on
    ``store`` with ``args`` after its holds' file; ``name`` is ``<release>-<n>`` (its holds go
    to ``out/<name>.jsonl``)."""
    path = out / f"{name}.jsonl"
    log = (out / f"{name}.log").open("w+")
    argv = [str(python), str(CHILD), command, json.dumps(database), version, store, str(path)]
    process = subprocess.Popen(
        [*argv, *args], cwd=out, env=user_env(), stdin=subprocess.DEVNULL, stdout=log, stderr=log
    )
    return name.rpartition("-")[0], path, process, log


def finish(children: list[Child], timeout: float, minimum: int = 10) -> list[dict[str, Any]]:
    """Wait for ``children``; every hold they recorded (at least ``minimum`` each)."""
    holds = []
    failures = []
    for release, path, process, log in children:
        code = process.wait(timeout=timeout)
        log.seek(0)
        output = log.read()
        log.close()
        if code != 0:
            failures.append(f"{release} process {path.name} exited {code}:\n{output}")
            continue
        records = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(records) >= minimum, f"{path.name} held only {len(records)} times:\n{output}"
        holds += [{**record, "release": release, "process": path.name} for record in records]
    assert not failures, "\n".join(failures)
    return holds


def contend(
    previous: Path, database: dict[str, Any], store: str, out: Path
) -> list[dict[str, Any]]:
    """Run the processes of both releases at once on ``store``; every hold they recorded."""
    pythons = [("previous", previous / "python", PREVIOUS_VERSION)] * PROCESSES_PER_RELEASE
    pythons += [("current", Path(sys.executable), django_locks.__version__)] * (
        PROCESSES_PER_RELEASE
    )
    children = [
        launch(
            out, f"{release}-{n}", python, version, "contend", database, store, str(SECONDS), *KEYS
        )
        for n, (release, python, version) in enumerate(pythons)
    ]
    return finish(children, SECONDS + 120)


def check_exclusive(holds: list[dict[str, Any]]) -> None:
    """Per key: no two holds overlap in time, tokens grow with time, and the key passed between
    the releases (both really contended on it)."""
    assert all(hold["held"] for hold in holds), [h for h in holds if not h["held"]]
    long_holds = [h for h in holds if h["end"] - h["start"] > 3.0]  # longer than the ttl
    assert {h["release"] for h in long_holds} == {"previous", "current"}, long_holds
    handovers = 0
    for key in KEYS:
        ordered = sorted((h for h in holds if h["key"] == key), key=lambda h: h["start"])
        assert len(ordered) >= 5, (key, len(ordered))
        for before, after in itertools.pairwise(ordered):
            assert before["end"] <= after["start"], ("overlapping holds", before, after)
            assert before["token"] < after["token"], ("token did not grow", before, after)
            handovers += before["release"] != after["release"]
    assert handovers >= 3, f"only {handovers} handovers between the releases"
    print(f"{len(holds)} holds, {handovers} handovers between the releases")


def migrated_database(postgres_server: Any, name: str, cwd: Path) -> dict[str, Any]:
    """A new database ``name`` with the current release's migrations, as a deploy runs them
    before the new processes start; its ``DATABASES`` entry."""
    conn = postgres_server.connect()
    try:
        conn.cursor().execute(f"DROP DATABASE IF EXISTS {name}")
        conn.cursor().execute(f"CREATE DATABASE {name}")
    finally:
        conn.close()
    database: dict[str, Any] = postgres_server.database_settings(name)
    run(
        [sys.executable, CHILD, "migrate", json.dumps(database), django_locks.__version__],
        cwd=cwd,
        env=user_env(),
    )
    return database


def steps(
    python: Path, version: str, database: dict[str, Any], store: str, cwd: Path, *actions: Any
) -> Any:
    """The results of ``actions`` run on ``store`` (``database``, ``redis=URL``) by a process
    of ``python``."""
    args = [str(python), str(CHILD), "steps", json.dumps(database), version, store]
    args.append(json.dumps(actions))
    return json.loads(run(args, cwd=cwd, env=user_env()).stdout.strip().splitlines()[-1])


def test_both_releases_on_one_postgresql_database(
    previous_release: Path, postgres_server: Any, tmp_path: Path
) -> None:
    database = migrated_database(postgres_server, "rolling_upgrade", tmp_path)
    holds = contend(previous_release, database, "database", tmp_path)
    check_exclusive(holds)
    # How each key's last lease reads now, to this release: a 0.1.0 process's release recorded
    # no reason, this release's "released".
    listed = steps(
        Path(sys.executable),
        django_locks.__version__,
        database,
        "database",
        tmp_path,
        *(["lease", key] for key in KEYS),
    )
    by_token = {hold["token"]: hold["release"] for hold in holds}
    for info in listed:
        release = by_token[info["fencing_token"]]
        assert info["state"] == "released", info
        assert info["ended"] == (None if release == "previous" else "released"), (release, info)
        assert info["holder_info"]["kind"] == "process", info  # a script: neither took a kind
    print("last leases:", {info["key"]: by_token[info["fencing_token"]] for info in listed})


def test_leases_a_previous_release_took_read_with_no_end_reason(
    previous_release: Path, postgres_server: Any, tmp_path: Path
) -> None:
    database = migrated_database(postgres_server, "rolling_upgrade_holders", tmp_path)

    def current(*actions: Any) -> Any:
        return steps(CURRENT, django_locks.__version__, database, "database", tmp_path, *actions)

    def previous(*actions: Any) -> Any:
        python = previous_release / "python"
        return steps(python, PREVIOUS_VERSION, database, "database", tmp_path, *actions)

    # This release's leases first, each leaving a description and an end behind on its row.
    current(
        ["acquire_as", "up:held", "new-1", 60_000, "worker", "stale-task-id"],
        ["renew", "up:held", "new-1", 60_000],
        ["end", "up:held", "new-1", "released"],
        ["acquire_as", "up:expired", "new-2", 60_000, "command", "stale-command"],
        ["end", "up:expired", "new-2", "handed back"],
        ["acquire_as", "up:released", "new-3", 60_000, "beat", "stale-beat"],
        ["leave", "up:released", "new-3", 200, "lapsed"],
        ["sleep", 0.4],
    )
    # Then 0.1.0's, on the migrated table: one held, one left to expire, one released.
    address, *answers = previous(
        ["address"],
        ["acquire", "up:held", "old-1", 60_000],
        ["renew", "up:held", "old-1", 60_000],
        ["acquire", "up:expired", "old-2", 300],
        ["renew", "up:expired", "old-2", 300],
        ["acquire", "up:released", "old-3", 60_000],
        ["renew", "up:released", "old-3", 60_000],
        ["release", "up:released", "old-3"],
        ["sleep", 0.6],
        ["leases"],
    )
    *calls, _, old_listing = answers
    assert [type(answer) for answer in calls] == [int, bool, int, bool, int, bool, bool], calls
    assert all(calls[1::2]), calls  # renewed and released: nothing failed on the new columns
    assert {info["key"]: info["state"] for info in old_listing} == {
        "up:held": "held",
        "up:expired": "expired",
        "up:released": "released",
    }
    held, expired, released, refused, forced, after = current(
        ["lease", "up:held"],
        ["lease", "up:expired"],
        ["lease", "up:released"],
        ["acquire_as", "up:held", "new-4", 60_000, "worker", "x"],
        ["force_end", "up:held", "admin alice"],
        ["lease", "up:held"],
    )
    host, _, pid = address.rpartition(":")
    undescribed = {"host": host, "pid": int(pid), "kind": "process", "detail": ""}
    for info, state in ((held, "held"), (expired, "expired"), (released, "released")):
        assert (info["state"], info["ended"], info["ended_by"]) == (state, None, None), info
        assert {name: info["holder_info"][name] for name in undescribed} == undescribed, info
        assert info["last_renewed"] is None, info  # 0.1.0 renewed, but recorded no time
        assert info["holder"] == f"{host} pid {pid}", info
    # A refused acquire names the 0.1.0 holder as what it is, nothing stale.
    assert isinstance(refused, dict), refused
    assert {name: refused[name] for name in undescribed} == undescribed, refused
    assert refused["expires_at"] == held["holder_info"]["expires_at"], (refused, held)
    # This release's operator ends it: that end is recorded, the rest stays unknown.
    assert forced is True
    assert (after["state"], after["ended"], after["ended_by"]) == (
        "released",
        "force released",
        "admin alice",
    )
    assert (after["holder_info"]["kind"], after["holder_info"]["detail"]) == ("process", "")


def test_both_releases_on_one_redis(
    previous_release: Path, redis_server: Any, postgres_server: Any, tmp_path: Path
) -> None:
    name = "rolling_upgrade_redis"
    conn = postgres_server.connect()
    try:
        conn.cursor().execute(f"DROP DATABASE IF EXISTS {name}")
        conn.cursor().execute(f"CREATE DATABASE {name}")
    finally:
        conn.close()
    # Django needs a database even when the locks live in Redis (nothing is migrated).
    database = postgres_server.database_settings(name)
    check_exclusive(contend(previous_release, database, f"redis={redis_server.url}", tmp_path))


def test_leases_of_either_release_read_on_one_redis(
    previous_release: Path, redis_server: Any, postgres_server: Any, tmp_path: Path
) -> None:
    name = "rolling_upgrade_redis_holders"
    conn = postgres_server.connect()
    try:
        conn.cursor().execute(f"DROP DATABASE IF EXISTS {name}")
        conn.cursor().execute(f"CREATE DATABASE {name}")
    finally:
        conn.close()
    database = postgres_server.database_settings(name)  # Django needs one; nothing migrated
    store = f"redis={redis_server.url}"

    def current(*actions: Any) -> Any:
        return steps(CURRENT, django_locks.__version__, database, store, tmp_path, *actions)

    def previous(*actions: Any) -> Any:
        python = previous_release / "python"
        return steps(python, PREVIOUS_VERSION, database, store, tmp_path, *actions)

    address, token, renewed, _ = previous(
        ["address"],
        ["acquire", "up:old", "old-1", 60_000],
        ["renew", "up:old", "old-1", 60_000],
        ["acquire", "up:gone", "old-2", 60_000],
    )
    assert isinstance(token, int) and renewed is True
    host, _, pid = address.rpartition(":")
    mine, held, refused, taken, released, gone = current(
        ["address"],
        ["lease", "up:old"],
        ["acquire_as", "up:old", "new-1", 60_000, "worker", "task-1"],
        ["acquire_as", "up:new", "new-2", 60_000, "worker", "task-2"],
        ["force_release", "up:gone"],
        ["lease", "up:gone"],
    )
    assert (held["state"], held["ended"], held["last_renewed"]) == ("held", None, None), held
    undescribed = {"host": host, "pid": int(pid), "kind": "process", "detail": ""}
    assert {field: held["holder_info"][field] for field in undescribed} == undescribed, held
    assert isinstance(refused, dict), refused  # the 0.1.0 holder, named, not an error
    assert {field: refused[field] for field in undescribed} == undescribed, refused
    assert isinstance(taken, int) and released is True
    assert gone is None  # Redis keeps no ended lease
    # The reverse: 0.1.0 lists, and is refused, a lease this release described.
    listing, refusal = previous(["leases"], ["acquire", "up:new", "old-3", 60_000])
    states = {info["key"]: info["state"] for info in listing if info["key"].startswith("up:")}
    assert states == {"up:old": "held", "up:new": "held"}, listing
    (described,) = [info for info in listing if info["key"] == "up:new"]
    assert (described["fencing_token"], described["holder"]) == (taken, mine), described
    assert refusal is None


@pytest.mark.parametrize("store_kind", ["database", "redis"])
def test_a_previous_release_renews_a_lease_this_release_asked_to_give_up(
    previous_release: Path,
    postgres_server: Any,
    tmp_path: Path,
    store_kind: str,
    request: pytest.FixtureRequest,
) -> None:
    """A preempt request (on_conflict="replace") does not preempt a run of a 0.1.0 process: its
    renewals know no requests, and renew the lease (docs/howto/upgrade.rst). The request its
    next lease leaves behind on the row names the ended lease's token, and no renewal of this
    release answers it."""
    name = f"rolling_upgrade_preempt_{store_kind}"
    if store_kind == "database":
        database, store = migrated_database(postgres_server, name, tmp_path), "database"
    else:
        conn = postgres_server.connect()
        try:
            conn.cursor().execute(f"DROP DATABASE IF EXISTS {name}")
            conn.cursor().execute(f"CREATE DATABASE {name}")
        finally:
            conn.close()
        database = postgres_server.database_settings(name)  # Django needs one; nothing migrated
        store = f"redis={request.getfixturevalue('redis_server').url}"

    def current(*actions: Any) -> Any:
        return steps(CURRENT, django_locks.__version__, database, store, tmp_path, *actions)

    def previous(*actions: Any) -> Any:
        python = previous_release / "python"
        return steps(python, PREVIOUS_VERSION, database, store, tmp_path, *actions)

    key = "up:asked"
    # 15 s: two process starts of each release come before the renewal (a 1.5 s lease expired
    # first under CI's load); the sleep then shows the renewal moved its expiry.
    (token,) = previous(["acquire", key, "old-1", 15_000])
    asked, refused = current(["preempt", key], ["acquire", key, "new-1", 60_000])
    assert isinstance(token, int) and asked == token and refused is None
    renewed, _ = previous(["renew", key, "old-1", 60_000], ["sleep", 15.5])  # past the 15 s
    held, still = current(["lease", key], ["acquire", key, "new-1", 60_000])
    assert renewed is True, renewed
    assert (held["state"], held["owner"], held["fencing_token"]) == ("held", "old-1", token)
    assert still is None
    released, newer = previous(["release", key, "old-1"], ["acquire", key, "old-2", 60_000])
    assert released is True and isinstance(newer, int) and newer > token
    (named,) = current(["preempt", key])
    again, freed = previous(["renew", key, "old-2", 60_000], ["release", key, "old-2"])
    assert named == newer and again is True and freed is True
    taken, answer, asked_again, preempted = current(
        ["acquire", key, "new-2", 60_000],
        ["renew", key, "new-2", 60_000],
        ["preempt", key],
        ["renew", key, "new-2", 60_000],
    )
    assert isinstance(taken, int) and taken > newer, taken
    assert answer is True  # a new lease: the request left behind was another token's
    assert asked_again == taken and preempted == "preempted"
