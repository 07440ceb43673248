"""Keys taken with permits on the admin's Leases page, through Django's test client, on real
stores (in-memory, SQLite, PostgreSQL, Redis): each slot one row showing its base key and
"permit n of N", the key's own record one summary row ("N permits, k held", no holder), sorted
and filtered as every row; releasing the summary frees every slot of the key, releasing a slot
that slot alone, and the confirmation page says how many permits are freed. On the database
store the held slots are counted inside the page's one query, each an index range."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry

from django_locks.holders import Holder
from django_locks.service import locks
from django_locks.stores.base import LockStore, PermitGrant
from tests.lease_rows import OWNER, explain, fill
from tests.test_admin import URL, checkboxes, listed, page_queries, releaser, rows, viewer

__all__ = ["releaser", "viewer"]  # the fixtures, shared with tests/test_admin.py

pytestmark = pytest.mark.django_db(transaction=True)
ON_POSTGRES = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "postgres"]),
]
KEY = "jobs:export"


def configured(settings: Any, request: pytest.FixtureRequest, kind: str) -> Iterator[LockStore]:
    if kind == "memory":
        settings.LOCKS = {
            "BACKEND": "django_locks.stores.InMemoryStore",
            "ALLOW_IN_MEMORY_STORAGE": True,
        }
    elif kind == "sqlite":
        settings.LOCKS = {"BACKEND": "django_locks.stores.DatabaseStore"}
    elif kind == "postgres":
        request.getfixturevalue("postgres_server")
        settings.LOCKS = {
            "BACKEND": "django_locks.stores.DatabaseStore",
            "OPTIONS": {"using": "postgres"},
        }
    else:
        server = request.getfixturevalue("redis_server")
        settings.LOCKS = {
            "BACKEND": "django_locks.stores.RedisStore",
            "OPTIONS": {"url": server.url},
        }
    store = locks.store
    assert store.supports_permits, f"{store} offers no permits"
    store.clear()
    yield store
    store.clear()
    store.close()


@pytest.fixture(
    params=[
        "memory",
        "sqlite",
        pytest.param("postgres", marks=ON_POSTGRES),
        pytest.param("redis", marks=pytest.mark.redis),
    ]
)
def store(settings: Any, request: pytest.FixtureRequest) -> Iterator[LockStore]:
    """Each store offering permits in turn, configured as the project's store."""
    yield from configured(settings, request, request.param)


def take(store: LockStore, count: int, permits: int = 5, key: str = KEY) -> list[int]:
    """``count`` slots of ``key`` (``permits``), each a worker of its own: their tokens."""
    tokens = []
    for n in range(count):
        holder = Holder(host="web-2", pid=4121 + n, kind="worker", detail=f"export-{n}")
        grant = store.acquire_permit(key, f"{OWNER}-{n}", 60_000, permits, holder)
        assert isinstance(grant, PermitGrant) and grant.permit == n + 1
        tokens.append(grant.fencing_token)
    return tokens


def row_of(html: str, key: str) -> dict[str, str]:
    """The text of each cell of ``key``'s row (tags left out), by column."""
    found = re.search(rf'<tr>(?:(?!</tr>).)*data-key="{re.escape(key)}".*?</tr>', html, re.S)
    assert found, key
    cells = re.findall(r'<t[dh] class="field-([a-z_]+)"[^>]*>(.*?)</t[dh]>', found.group(0), re.S)
    return {name: " ".join(re.sub(r"<[^>]+>", "", text).split()) for name, text in cells}


def held_keys(store: LockStore) -> set[str]:
    return {lease.key for lease in store.leases()}


def test_each_slot_is_a_row_and_the_key_a_summary_with_no_holder(store, releaser):
    take(store, 3)
    assert isinstance(store.acquire("plain:one", f"{OWNER}-plain", 60_000), int)
    html = releaser.get(URL).content.decode()
    slots = [f"{KEY}#{n}" for n in (1, 2, 3)]
    assert set(rows(html)) == {(key, "held") for key in (KEY, *slots, "plain:one")}
    summary = row_of(html, KEY)
    assert summary["lease_key"] == f"{KEY} 5 permits, 3 held"
    assert summary["lease_holder"] in ("", "-")  # a summary is nobody's lease
    second = row_of(html, f"{KEY}#2")
    assert second["lease_key"] == f"{KEY} permit 2 of 5"  # the base key, readably
    assert second["lease_holder"].startswith("web-2 pid 4122 (celery task export-1")
    assert row_of(html, "plain:one")["lease_key"] == "plain:one"
    # Every held row can be selected: the summary (the whole key) and each slot.
    assert set(checkboxes(html)) == {KEY, *slots, "plain:one"}
    assert OWNER not in html and ">permits<" not in html
    # Searching for the key finds the key and each of its slots.
    assert set(listed(releaser.get(URL, {"q": "JOBS:"}).content.decode())) == {KEY, *slots}


def test_releasing_the_summary_frees_every_slot_of_the_key(store, releaser):
    tokens = take(store, 3)
    store.acquire("plain:one", f"{OWNER}-plain", 60_000)
    selected = {"action": "release_selected", "_selected_action": [KEY]}
    page = releaser.post(URL, {**selected, "index": "0"}).content.decode()
    assert f"{KEY}: 5 permits, 3 held: every permit of the key is freed" in page
    assert "3 permits are freed: their holders lose them at their next renewal." in page
    assert held_keys(store) == {KEY, f"{KEY}#1", f"{KEY}#2", f"{KEY}#3", "plain:one"}

    follow = releaser.post(URL, {**selected, "post": "yes"}, follow=True).content.decode()
    assert "Released 3 leases: their holders lose them" in follow
    assert f"Freed every permit of {KEY}: 3 were held." in follow
    assert "Not held any more" not in follow
    assert held_keys(store) == {"plain:one"}
    entry = LogEntry.objects.get()
    assert entry.object_id == KEY and "every permit of the key" in entry.change_message
    if store.keeps_ended_leases:  # the ended slots stay listed, each force released
        ended = dict(rows(follow))
        assert [ended[f"{KEY}#{n}"] for n in (1, 2, 3)] == ["force released"] * 3
        state = listed(releaser.get(URL, {"state": "force released"}).content.decode())
        assert set(state) == {KEY, f"{KEY}#1", f"{KEY}#2", f"{KEY}#3"}
        assert "5 permits, 0 held" in row_of(follow, KEY)["lease_key"]
    # The key's tokens keep growing past every slot's.
    again = take(store, 1)
    assert again[0] > max(tokens)


def test_releasing_a_slot_frees_that_permit_alone(store, releaser):
    take(store, 3)
    selected = {"action": "release_selected", "_selected_action": [f"{KEY}#2"]}
    page = releaser.post(URL, selected).content.decode()
    assert f"{KEY}#2: permit 2 of 5 of {KEY}, held by web-2 pid 4122" in page
    assert "1 permit is freed: its holder loses it at its next renewal." in page
    follow = releaser.post(URL, {**selected, "post": "yes"}, follow=True).content.decode()
    assert "Released 1 lease: its holder loses it" in follow
    assert held_keys(store) == {KEY, f"{KEY}#1", f"{KEY}#3"}
    assert row_of(follow, KEY)["lease_key"] == f"{KEY} 5 permits, 2 held"
    entry = LogEntry.objects.get()
    assert entry.object_id == f"{KEY}#2" and f"permit 2 of 5 of '{KEY}'" in entry.change_message


def test_a_slot_selected_with_its_key_is_freed_with_it_once(store, releaser):
    take(store, 2, permits=3)
    selected = {"action": "release_selected", "_selected_action": [f"{KEY}#1", KEY]}
    page = releaser.post(URL, selected).content.decode()
    assert f"{KEY}#1: permit 1 of 3, freed with every permit of {KEY}" in page
    assert "2 permits are freed" in page
    follow = releaser.post(URL, {**selected, "post": "yes"}, follow=True).content.decode()
    assert "Released 2 leases" in follow and "Not held any more" not in follow
    assert held_keys(store) == set()
    assert [entry.object_id for entry in LogEntry.objects.all()] == [KEY]


def test_a_view_only_user_sees_permits_but_cannot_release_them(store, viewer):
    take(store, 2)
    html = viewer.get(URL).content.decode()
    assert row_of(html, KEY)["lease_key"] == f"{KEY} 5 permits, 2 held"
    data = {"action": "release_selected", "_selected_action": [KEY], "post": "yes"}
    assert viewer.post(URL, data).status_code == 403
    assert len(held_keys(store)) == 3


# The database store's page: the count is part of the listing's one query.


@pytest.fixture
def sqlite(settings: Any, request: pytest.FixtureRequest) -> Iterator[LockStore]:
    yield from configured(settings, request, "sqlite")


def test_the_held_slots_are_counted_in_the_pages_one_query(sqlite, viewer):
    for n in range(4):
        take(sqlite, 2 + n % 2, permits=3, key=f"tenant:{n}")
    html, sql = page_queries(viewer, "default", state="held")
    assert len(sql) == 3, sql  # the filtered count, the full count, the page: as without permits
    assert [row_of(html, f"tenant:{n}")["lease_key"] for n in range(4)] == [
        f"tenant:{n} 3 permits, {2 + n % 2} held" for n in range(4)
    ]
    # Sorted by key as any row: each key, then its slots.
    assert listed(viewer.get(URL, {"o": "0"}).content.decode())[:4] == [
        "tenant:0",
        "tenant:0#1",
        "tenant:0#2",
        "tenant:1",
    ]


@pytest.fixture
def postgres(settings: Any, request: pytest.FixtureRequest) -> Iterator[LockStore]:
    yield from configured(settings, request, "postgres")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
def test_on_100000_rows_each_summary_counts_its_slots_through_the_key_index(postgres, viewer):
    """Among 100,000 ended rows, a page of 100 summaries counts each one's slots by a range of
    the key's index (a language collation would not order ``#`` bytewise), never a scan of the
    table per summary."""
    fill("postgres", ended=100_000)
    for n in range(100):
        take(postgres, 1 + n % 3, permits=4, key=f"tenant:{n:03}")
    html, sql = page_queries(viewer, "postgres", state="held", o="0")  # by key
    assert len(sql) == 3, sql
    assert row_of(html, "tenant:007")["lease_key"] == "tenant:007 4 permits, 2 held"
    plan = explain("postgres", sql[-1])
    subplan = plan[plan.index("SubPlan") :]  # the count, run for each summary of the page
    assert "Index" in subplan and "Seq Scan" not in subplan, plan
