"""A rolling upgrade (SPEC section 9): processes of the first release (0.1.0, built from this
repository's own history) and of the current tree contend on one PostgreSQL database, after the
current migrations, and on one Redis. Neither fails; neither takes a key the other holds."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def contend(
    previous: Path, database: dict[str, Any], store: str, out: Path
) -> list[dict[str, Any]]:
    """Run the processes of both releases at once on ``store``; every hold they recorded."""
    pythons = [("previous", previous / "python", PREVIOUS_VERSION)] * PROCESSES_PER_RELEASE
    pythons += [("current", Path(sys.executable), django_locks.__version__)] * (
        PROCESSES_PER_RELEASE
    )
    children = []
    for n, (release, python, version) in enumerate(pythons):
        path = out / f"{release}-{n}.jsonl"
        args = [str(python), str(CHILD), "contend", json.dumps(database), version, store]
        args += [str(path), str(SECONDS), *KEYS]
        log = (out / f"{release}-{n}.log").open("w+")
        process = subprocess.Popen(
            args, cwd=out, env=user_env(), stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
        children.append((release, path, process, log))
    holds = []
    failures = []
    for release, path, process, log in children:
        code = process.wait(timeout=SECONDS + 120)
        log.seek(0)
        output = log.read()
        log.close()
        if code != 0:
            failures.append(f"{release} process {path.name} exited {code}:\n{output}")
            continue
        records = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(records) >= 10, f"{path.name} held only {len(records)} times:\n{output}"
        holds += [{**record, "release": release, "process": path.name} for record in records]
    assert not failures, "\n".join(failures)
    return holds


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


def test_both_releases_on_one_postgresql_database(
    previous_release: Path, postgres_server: Any, tmp_path: Path
) -> None:
    name = "rolling_upgrade"
    conn = postgres_server.connect()
    try:
        conn.cursor().execute(f"DROP DATABASE IF EXISTS {name}")
        conn.cursor().execute(f"CREATE DATABASE {name}")
    finally:
        conn.close()
    database = postgres_server.database_settings(name)
    # The current release's migrations, as a deploy runs them before the new processes start.
    run(
        [sys.executable, CHILD, "migrate", json.dumps(database), django_locks.__version__],
        cwd=tmp_path,
        env=user_env(),
    )
    check_exclusive(contend(previous_release, database, "database", tmp_path))


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
