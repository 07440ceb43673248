"""The django-q2 guide (docs/howto/django-q2.rst), run as printed: its task in two real
``manage.py qcluster`` clusters of two workers each, on the ORM broker and the database lock store
of one fresh PostgreSQL database (migrated by ``manage.py migrate``).

Rebuilds queued at once with ``async_task`` never run two at once with ``without_overlapping``
(those finding one running are skipped), and run side by side without it.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.guides.children import Children, most_at_once, spans
from tests.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

CHILD = "tests.guides.django_q_child"


@pytest.fixture
def children(tmp_path: Path, postgres_server: Any) -> Iterator[Children]:
    name = f"guides_q_{uuid.uuid4().hex[:8]}"
    with contextlib.closing(postgres_server.connect()) as conn:
        conn.cursor().execute(f"CREATE DATABASE {name}")
    database = {**postgres_server.database_settings(name), "NAME": name}
    group = Children(
        tmp_path,
        settings="tests.guides.django_q_settings",
        databases={"default": database},
        locks={"BACKEND": "django_locks.stores.DatabaseStore", "TTL": "2s"},
    )
    try:
        group.run(["-m", "django", "migrate", "-v", "0"], timeout=120)
        for cluster in ("cluster-1", "cluster-2"):
            group.start(cluster, ["-m", CHILD, "qcluster"])
        eventually(lambda: len(group.runs("ready")) == 2, timeout=30, what=group.destroy)
        time.sleep(2.0)  # both clusters' workers polling the broker
        yield group
    finally:
        print(group.destroy())  # shown by pytest for a failed test only
        with contextlib.closing(postgres_server.connect()) as conn:
            conn.cursor().execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def enqueue(children: Children, mode: str, count: int) -> list[tuple[float, float]]:
    children.run(["-m", CHILD, "enqueue", mode, str(count)])
    time.sleep(3.0)  # every task taken (four workers), each run 0.3 s
    return spans(children.runs())


def test_rebuilds_queued_at_once_never_run_two_at_once(children: Children) -> None:
    runs = enqueue(children, "decorated", 8)
    assert most_at_once(runs) == 1, runs
    assert 1 <= len(runs) < 8, runs  # those that found a rebuild running were skipped


def test_without_the_decorator_the_clusters_run_them_at_once(children: Children) -> None:
    runs = enqueue(children, "undecorated", 8)
    assert len(runs) == 8, runs
    assert most_at_once(runs) >= 3, runs
