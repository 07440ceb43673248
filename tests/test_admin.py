"""The admin's Leases page through Django's test client.

On the database store it is Django's changelist over the ``Lease`` table: every state filtered,
searched, sorted, counted and paged in SQL on the store's alias, whatever the routers say. On
the other stores it lists their ``leases()`` with only the filters they can fill. Read-only,
permissions held under attack, the release action (confirmed, recorded, refused on ended rows),
the store named for people, readable keys, the optional auto-refresh. (The real-browser test is
tests/test_admin_browser.py.)
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission
from django.db import connections
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_locks.admin import LeaseAdmin
from django_locks.admin.rows import short_duration
from django_locks.admin.states import FILTERS
from django_locks.holders import Holder
from django_locks.models import Lease
from django_locks.service import locks
from django_locks.stores.base import LockStore
from django_locks.stores.database import DatabaseStore
from django_locks.stores.memory import InMemoryStore
from django_locks.testing import ManualClock
from tests.lease_rows import EXPECTED, LONG_DETAIL, OWNER, fill, put, put_every_state
from tests.waiting import eventually

URL = "/admin/django_locks/lease/"


def user(django_user_model: Any, name: str, *perms: str, superuser: bool = False) -> Any:
    if superuser:
        return django_user_model.objects.create_superuser(name, f"{name}@example.com", "pw")
    account = django_user_model.objects.create_user(name, password="pw", is_staff=True)
    for codename in perms:
        account.user_permissions.add(Permission.objects.get(codename=codename))
    return account


@pytest.fixture
def viewer(client: Client, django_user_model: Any) -> Client:
    client.force_login(user(django_user_model, "viewer", "view_lease"))
    return client


@pytest.fixture
def releaser(client: Client, django_user_model: Any) -> Client:
    client.force_login(user(django_user_model, "releaser", "view_lease", "release_lease"))
    return client


def rows(html: str) -> list[tuple[str, str]]:
    """The listed leases, in order: (key, state) as the page marks them."""
    keys = re.findall(r'<span class="lease-key" data-key="([^"]+)"', html)
    states = re.findall(r'<span class="lease-state" data-state="([^"]+)"', html)
    assert len(keys) == len(states)
    return list(zip(keys, states, strict=True))


def labels(html: str) -> dict[str, str]:
    """What each row's State cell reads (tags left out): key -> "Force released by ...", ..."""
    found = {}
    for row in re.findall(r"<tr>.*?</tr>", html, re.S):
        key = re.search(r'data-key="([^"]+)"', row)
        cell = re.search(r'<td class="field-state">(.*?)</td>', row, re.S)
        if key and cell:
            found[key.group(1)] = re.sub(r"<[^>]+>", "", cell.group(1)).strip()
    return found


def listed(html: str) -> list[str]:
    return [key for key, _ in rows(html)]


def checkboxes(html: str) -> list[str]:
    return re.findall(r'name="_selected_action" value="([^"]+)"', html)


def filter_links(html: str) -> list[str]:
    # Django 5.2 wraps the filters in a <nav>, 6.0 in a <search>.
    nav = re.search(r'<(nav|search) id="changelist-filter".*?</\1>', html, re.S)
    return re.findall(r"<a href=\"[^\"]*\">([^<]+)</a>", nav.group(0)) if nav else []


@pytest.fixture
def database(settings: Any) -> Iterator[str]:
    """The configured store is the database store on SQLite (``default``), with a lease in
    every state."""
    settings.LOCKS = {"BACKEND": "django_locks.stores.DatabaseStore"}
    put_every_state()
    yield "default"
    locks.store.close()


@pytest.fixture
def postgres(settings: Any, postgres_server: Any) -> Iterator[str]:
    """The same on the session's PostgreSQL (alias ``postgres``)."""
    settings.LOCKS = {
        "BACKEND": "django_locks.stores.DatabaseStore",
        "OPTIONS": {"using": "postgres"},
    }
    put_every_state("postgres")
    yield "postgres"
    locks.store.close()


DB = pytest.mark.django_db(transaction=True)


@DB
def test_database_page_shows_every_state_held_first_then_the_most_recent_ends(viewer, database):
    html = viewer.get(URL).content.decode()
    assert rows(html) == list(EXPECTED.items())
    assert labels(html)["force-released:alice"] == "Force released by admin alice"
    assert labels(html)["lapsed:min-hold"] == "Lapsed"
    # The holder on one line: host, pid, what it runs; the title carries all of it.
    assert '<span class="lease-holder" title="web-2 pid 4121 since ' in html
    assert (
        "web-2 pid 4121 (celery task nightly-export-" + "x" * 24 + "\N{HORIZONTAL ELLIPSIS})"
        in html
    )
    assert f"unless renewed\n{LONG_DETAIL}" in html
    assert "web-2 pid 4121 (command)" in html and "web-2 pid 4121 (celery beat)" in html
    # A 0.1.0 process's lease: its host and pid alone (the columns describe another token).
    old = re.search(r'data-key="held:old-process".*?</tr>', html, re.S)
    assert old and ">web-2 pid 4121</span>" in old.group(0)
    assert re.search(r">in 1[45]m( \d+s)?<", html)  # expires in, on the database's clock
    assert re.search(r"\(1m( \d+s)? ago\)", html)  # ended at, and how long ago
    assert OWNER not in html  # the owner id is the holder's secret
    assert '"<DatabaseStore' not in html and "&lt;DatabaseStore" not in html
    assert "Leases of the lock store SQLite &quot;default&quot;" in html


@DB
def test_only_held_rows_can_be_selected(releaser, database):
    html = releaser.get(URL).content.decode()
    assert checkboxes(html) == ["held:export", "held:old-process"]
    assert 'data-actions-icnt="2"' in html and "0 of 2 selected" in html
    assert OWNER not in html


def page_queries(client: Client, alias: str, **params: str) -> tuple[str, list[str]]:
    """The page, and the SQL it ran on ``alias`` against the lease table."""
    with CaptureQueriesContext(connections[alias]) as queries:
        html = client.get(URL, params).content.decode()
    return html, [q["sql"] for q in queries if "django_locks_lease" in q["sql"]]


def check_filters(client: Client, alias: str) -> None:
    """Each state filter lists exactly its rows, from one WHERE in SQL; together they list
    every row once, each with the state its filter names."""
    seen: list[str] = []
    for state in FILTERS:
        html, sql = page_queries(client, alias, state=state)
        assert rows(html) == [(k, s) for k, s in EXPECTED.items() if s == state], state
        seen += listed(html)
        # The filtered count, the full count, the page: three queries, the filter in SQL.
        assert len(sql) == 3, sql
        # (The page's own query counts a permits summary's held slots in a subquery.)
        assert sum(q.upper().startswith("SELECT COUNT(") for q in sql) == 2
        assert '"released_at" IS' in sql[0] and '"released_at" IS' in sql[2]
    assert sorted(seen) == sorted(EXPECTED)


@DB
def test_each_state_filter_is_a_where_in_sql(viewer, database):
    check_filters(viewer, database)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
def test_each_state_filter_is_a_where_in_sql_on_postgres(viewer, postgres):
    check_filters(viewer, postgres)
    html = viewer.get(URL).content.decode()
    assert rows(html) == list(EXPECTED.items())
    assert "Leases of the lock store PostgreSQL &quot;postgres&quot;" in html


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
def test_on_100000_ended_rows_each_page_is_one_query_of_a_page(viewer, settings, postgres_server):
    """On 100,000 ended rows and 100 held ones, the held page and the unfiltered page each read
    one page of rows, count in SQL, and order held leases first (the most recent ends next)."""
    settings.LOCKS = {
        "BACKEND": "django_locks.stores.DatabaseStore",
        "OPTIONS": {"using": "postgres"},
    }
    fill("postgres", ended=100_000, held=100)
    html, sql = page_queries(viewer, "postgres", state="held")
    assert len(listed(html)) == 100 and "100 leases" in html
    assert len(sql) == 3, sql  # the filtered count, the full count, the page's rows
    html, sql = page_queries(viewer, "postgres")
    assert "100100 leases" in html
    assert listed(html)[:100] == sorted(listed(html)[:100], key=lambda k: -int(k.rsplit(":", 1)[1]))


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
def test_lock_traffic_updates_lease_rows_in_place(settings, postgres_server):
    """The lease table has no index but its primary key, so the writes of every acquire,
    renewal and release (which move expires_at, released_at) are HOT updates on PostgreSQL,
    counted by the server: an index on either column would make each of them update every
    index (about 10% more server time per acquire and release, measured)."""
    settings.LOCKS = {
        "BACKEND": "django_locks.stores.DatabaseStore",
        "OPTIONS": {"using": "postgres"},
    }
    with connections["postgres"].cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE tablename = 'django_locks_lease'")
        indexes = [row[0] for row in cursor.fetchall()]
    # The primary key and Django's pattern index on it: the key never changes.
    assert all("(key" in index for index in indexes), indexes

    def counts() -> tuple[int, int]:
        with connections["postgres"].cursor() as cursor:
            cursor.execute(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                "WHERE relname = 'django_locks_lease'"
            )
            updated, hot = cursor.fetchone()
        return int(updated), int(hot)

    lock = locks.acquire("hot:renewals", ttl="60s")
    assert lock is not None
    lock.release()
    before = counts()
    for _ in range(100):
        lock = locks.acquire("hot:renewals", ttl="60s")
        assert lock is not None
        assert locks.store.renew(lock.key, lock.owner, 60_000)
        lock.release()
    # The store's backend reports its counts when idle (within a second or so).
    locks.store.close()

    eventually(
        lambda: counts()[0] - before[0] >= 300, timeout=15, what="the server to count the updates"
    )
    updated, hot = counts()
    hot_share = (hot - before[1]) / (updated - before[0])
    print(f"\nHOT updates: {hot - before[1]} of {updated - before[0]} ({hot_share:.0%})")
    assert hot_share > 0.9


@DB
def test_the_filters_are_the_seven_states_and_invalid_ones_are_refused(viewer, database):
    html = viewer.get(URL).content.decode()
    assert filter_links(html) == [
        "All", "Held", "Released", "Handed back", "Lapsed", "Expired", "Max hold",
        "Force released",
    ]  # fmt: skip
    counted = viewer.get(URL, {"_facets": "1"}).content.decode()  # Django's "Show counts"
    assert "Held (2)" in counted and "Handed back (2)" in counted and "Released (3)" in counted
    response = viewer.get(URL, {"state": "sleeping"})
    assert response.status_code == 302 and response["Location"].endswith("?e=1")


@DB
def test_columns_sort_in_sql(viewer, database):
    # The viewer has no action column: list_display index 0 is the key.
    assert listed(viewer.get(URL, {"o": "0"}).content.decode()) == sorted(EXPECTED)
    assert listed(viewer.get(URL, {"o": "-0"}).content.decode()) == sorted(EXPECTED, reverse=True)
    tokens = viewer.get(URL, {"o": "3"}).content.decode()
    assert listed(tokens) == [k for k, _ in sorted(EXPECTED.items(), key=lambda kv: _token(kv[0]))]
    by_state = [state for _, state in rows(viewer.get(URL, {"o": "1"}).content.decode())]
    assert by_state == sorted(by_state, key=FILTERS.index)
    _, sql = page_queries(viewer, database, o="-6")  # "Expires in / ended at", descending
    assert 'ORDER BY "django_locks_lease"."expires_at" DESC' in sql[-1]


def _token(key: str) -> int:
    return Lease.objects.get(key=key).fencing_token


@DB
def test_search_by_key_or_holder_with_counts(viewer, database, monkeypatch):
    assert listed(viewer.get(URL, {"q": "HELD:"}).content.decode()) == [
        "held:export",
        "held:old-process",
    ]
    assert listed(viewer.get(URL, {"q": "nightly-export"}).content.decode()) == ["held:export"]
    html = viewer.get(URL, {"q": "web-2:4121", "state": "lapsed"}).content.decode()
    assert listed(html) == ["lapsed:min-hold"]
    assert "1 result" in html and f"{len(EXPECTED)} total" in html
    monkeypatch.setattr(LeaseAdmin, "list_per_page", 4)
    first = viewer.get(URL).content.decode()
    assert listed(first) == list(EXPECTED)[:4]
    # Django 6.0 adds role="button" to the page links.
    assert re.search(r'<a (role="button" )?href="\?p=2">2</a>', first), "a link to page 2"
    assert f"{len(EXPECTED)} leases" in first
    assert listed(viewer.get(URL, {"p": "3"}).content.decode()) == list(EXPECTED)[8:]


@DB
def test_read_only_and_only_view_and_release_permissions(viewer, database):
    codenames = set(
        Permission.objects.filter(content_type__app_label="django_locks").values_list(
            "codename", flat=True
        )
    )
    assert codenames == {"view_lease", "release_lease"}
    index = viewer.get(reverse("admin:index")).content.decode()
    assert URL in index and f"{URL}add/" not in index
    for page in ("add/", "held:export/change/", "held:export/delete/", "held:export/history/"):
        assert viewer.get(f"{URL}{page}").status_code == 404


@DB
def test_anonymous_and_non_staff_users_are_sent_to_the_login_page(
    client, django_user_model, database
):
    response = client.get(URL)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))
    client.force_login(django_user_model.objects.create_user("visitor", password="pw"))
    response = client.get(URL)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))
    assert client.post(URL, {"action": "release_selected", "_selected_action": ["held:export"],
                             "post": "yes"}).status_code == 302  # fmt: skip
    assert Lease.objects.get(key="held:export").released_at is None


@DB
def test_staff_without_the_view_permission_get_403(client, django_user_model, database):
    client.force_login(user(django_user_model, "staff"))
    assert client.get(URL).status_code == 403
    assert URL not in client.get(reverse("admin:index")).content.decode()


@DB
def test_view_only_users_have_no_action_and_a_forged_release_is_refused(viewer, database):
    html = viewer.get(URL).content.decode()
    assert 'name="action"' not in html and "_selected_action" not in html
    for post in ({}, {"post": "yes"}, {"index": "0"}):
        response = viewer.post(
            URL, {"action": "release_selected", "_selected_action": ["held:export"], **post}
        )
        assert response.status_code == 403
    assert Lease.objects.get(key="held:export").released_at is None
    assert not LogEntry.objects.exists()


@DB
def test_a_forged_csrf_post_releases_nothing(django_user_model, database):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user(django_user_model, "root", superuser=True))
    response = client.post(
        URL, {"action": "release_selected", "_selected_action": ["held:export"], "post": "yes"}
    )
    assert response.status_code == 403
    assert Lease.objects.get(key="held:export").released_at is None
    assert not LogEntry.objects.exists()


class RecordingDatabaseStore(DatabaseStore):
    """The database store, noting who each ``force_end`` names (then doing it)."""

    ended: list[tuple[str, str]] = []

    def force_end(self, key: str, by: str) -> bool:
        self.ended.append((key, by))
        return super().force_end(key, by)


@DB
def test_release_confirms_then_force_ends_held_leases_only_and_logs(releaser, settings):
    settings.LOCKS = {"BACKEND": "tests.test_admin.RecordingDatabaseStore"}
    RecordingDatabaseStore.ended = []
    store = locks.store
    try:
        token = store.acquire("invoices:nightly", f"{OWNER}-1", 60_000)
        put("expired:crash", token=50, ended="expiry", minutes=1)
        selected = {
            "action": "release_selected",
            "_selected_action": ["invoices:nightly", "expired:crash"],
        }
        confirm = releaser.post(f"{URL}?q=i", {**selected, "index": "0"})
        assert confirm.status_code == 200
        page = confirm.content.decode()
        assert "Are you sure" in page and 'SQLite "default"' in page.replace("&quot;", '"')
        assert "invoices:nightly: held by " in page
        assert f"fencing token {token}" in page
        assert "expired:crash: not held, nothing to release" in page
        assert OWNER not in page
        assert store.lease("invoices:nightly") is not None  # nothing released yet

        done = releaser.post(f"{URL}?q=i", {**selected, "post": "yes"})
        assert done.status_code == 302 and done["Location"] == f"{URL}?q=i"
        assert RecordingDatabaseStore.ended == [("invoices:nightly", "admin releaser")]
        assert store.lease("invoices:nightly") is None
        crash = Lease.objects.get(key="expired:crash")
        assert crash.released_at is None and crash.end_reason is None  # refused: it had ended
        entry = LogEntry.objects.get()
        assert (entry.object_id, entry.action_flag, entry.user.username) == (
            "invoices:nightly",
            CHANGE,
            "releaser",
        )
        assert f"fencing token {token}" in entry.change_message
        follow = releaser.get(done["Location"]).content.decode()
        assert "Released 1 lease" in follow
        assert "Not held any more, nothing to release: expired:crash" in follow
        again = store.acquire("invoices:nightly", "o9", 60_000)
        assert again is not None and token is not None and again > token  # the token floor
    finally:
        store.clear()
        store.close()


@DB
def test_action_without_selection_or_action_changes_nothing(releaser, database):
    response = releaser.post(URL, {"action": "release_selected", "index": "0"}, follow=True)
    assert "Items must be selected" in response.content.decode()
    response = releaser.post(
        URL, {"action": "", "index": "0", "_selected_action": ["held:export"]}, follow=True
    )
    assert "No action selected" in response.content.decode()
    assert Lease.objects.get(key="held:export").released_at is None


class RefuseLeases:
    """A router sending everything of django_locks to an alias that does not exist."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return "nowhere" if model._meta.app_label == "django_locks" else None

    db_for_write = db_for_read


@DB
def test_database_store_reads_its_own_alias_whatever_the_routers_say(releaser, database, settings):
    settings.DATABASE_ROUTERS = ["tests.test_admin.RefuseLeases"]
    html = releaser.get(URL, {"state": "held"}).content.decode()
    assert listed(html) == ["held:export", "held:old-process"]
    response = releaser.post(
        URL, {"action": "release_selected", "_selected_action": ["held:export"], "post": "yes"}
    )
    assert response.status_code == 302
    settings.DATABASE_ROUTERS = []
    assert Lease.objects.get(key="held:export").released_at is not None


@DB
def test_auto_refresh_is_off_by_default_and_kept_in_every_link(viewer, database):
    html = viewer.get(URL).content.decode()
    assert "refresh.js" not in html and 'http-equiv="refresh"' not in html
    assert '<a href="?refresh=5" class="lease-refresh">Refresh every 5 s</a>' in html
    html = viewer.get(URL, {"refresh": "5", "state": "held"}).content.decode()
    assert listed(html) == ["held:export", "held:old-process"]  # not taken for a filter
    assert 'refresh.js" data-seconds="5" defer' in html
    assert '<noscript><meta http-equiv="refresh" content="5"></noscript>' in html
    assert "Refreshed every 5 seconds." in html and ">Stop refreshing</a>" in html
    assert '<a href="?state=held">' not in html  # the links keep the refresh
    assert '<a href="?refresh=5&amp;state=lapsed">Lapsed</a>' in html
    for bogus in ("0", "1", "99999", "soon"):
        assert "refresh.js" not in viewer.get(URL, {"refresh": bogus}).content.decode()


@DB
def test_keys_wrap_at_their_separators_not_inside_words(viewer, settings):
    settings.LOCKS = {"BACKEND": "django_locks.stores.DatabaseStore"}
    put("report:{customer_id}/2026.11#3", token=1)
    html = viewer.get(URL).content.decode()
    assert "report:<wbr>{customer_id}/<wbr>2026.<wbr>11#<wbr>3</span>" in html
    assert "overflow-wrap: anywhere" not in html and "overflow-wrap:anywhere" not in html
    assert "word-break: normal; overflow-wrap: break-word" in html


# The other stores: their leases() listing.


@pytest.fixture
def memory(settings: Any) -> Iterator[ManualClock]:
    """The in-memory store (whose clock moves only when told) with a lease in every state."""
    clock = ManualClock()
    settings.LOCKS = {
        "BACKEND": "django_locks.stores.InMemoryStore",
        "ALLOW_IN_MEMORY_STORAGE": True,
        "CLOCK": clock,
    }
    store = locks.store
    worker = Holder(host="web-2", pid=4121, kind="worker", detail=LONG_DETAIL)
    for key in ("held:export", "released:clean", "handed-back:shutdown", "lapsed:min-hold",
                "expired:crash", "force-released:alice", "max-hold:stuck"):  # fmt: skip
        assert isinstance(store.acquire_as(key, f"{OWNER}-{key}", 60_000, worker), int)
    store.end("released:clean", f"{OWNER}-released:clean", "released")
    store.end("handed-back:shutdown", f"{OWNER}-handed-back:shutdown", "handed back")
    store.leave("lapsed:min-hold", f"{OWNER}-lapsed:min-hold", 1_000, "lapsed")
    store.leave("max-hold:stuck", f"{OWNER}-max-hold:stuck", 1_000, "max hold")
    store.renew("expired:crash", f"{OWNER}-expired:crash", 1_000)
    store.force_end("force-released:alice", by="admin alice")
    clock.advance("2s")
    store.renew("held:export", f"{OWNER}-held:export", 60_000)
    yield clock


@pytest.mark.django_db
def test_memory_store_lists_every_state_with_every_filter(releaser, memory):
    html = releaser.get(URL).content.decode()
    assert rows(html) == [
        ("held:export", "held"),
        ("expired:crash", "expired"),
        ("force-released:alice", "force released"),
        ("handed-back:shutdown", "handed back"),
        ("lapsed:min-hold", "lapsed"),
        ("max-hold:stuck", "max hold"),
        ("released:clean", "released"),
    ]
    assert labels(html)["force-released:alice"] == "Force released by admin alice"
    assert filter_links(html) == [
        "All", "Held (1)", "Released (1)", "Handed back (1)", "Lapsed (1)", "Expired (1)",
        "Max hold (1)", "Force released (1)",
    ]  # fmt: skip
    assert "in 1m" in html and "(1s ago)" in html  # on the store's (manual) clock
    assert "web-2 pid 4121 (celery task nightly-export-" in html
    assert checkboxes(html) == ["held:export"]
    assert OWNER not in html
    assert "Leases of the lock store in-memory store (this process only)" in html
    assert listed(releaser.get(URL, {"state": "lapsed"}).content.decode()) == ["lapsed:min-hold"]
    assert len(listed(releaser.get(URL, {"q": "WEB-2 pid"}).content.decode())) == 7
    assert listed(releaser.get(URL, {"q": "crash"}).content.decode()) == ["expired:crash"]


@pytest.mark.django_db
def test_memory_store_release_records_who_and_refuses_ended_leases(releaser, memory):
    selected = {"action": "release_selected", "_selected_action": ["held:export", "expired:crash"]}
    page = releaser.post(URL, selected).content.decode()
    assert "held:export: held by web-2 pid 4121 (celery task" in page
    assert "expired:crash: Expired, nothing to release" in page
    follow = releaser.post(URL, {**selected, "post": "yes"}, follow=True).content.decode()
    assert "Released 1 lease" in follow
    assert "Not held any more, nothing to release: expired:crash" in follow
    assert ("held:export", "force released") in rows(follow)
    assert labels(follow)["held:export"] == "Force released by admin releaser"
    crash = locks.store.lease("expired:crash", include_inactive=True)
    assert crash is not None and crash.ended == "expired"  # refused: it had ended
    assert LogEntry.objects.get().object_id == "held:export"


@pytest.mark.django_db
def test_listing_page_refuses_a_forged_release(viewer, memory):
    for post in ({}, {"post": "yes"}):
        data = {"action": "release_selected", "_selected_action": ["held:export"], **post}
        assert viewer.post(URL, data).status_code == 403
    assert locks.store.lease("held:export") is not None


class ListingStore(InMemoryStore):
    """A custom store that keeps ended leases but records no holder nor how they ended."""

    describes_holders = False


@pytest.mark.django_db
def test_a_store_that_records_no_ends_shows_held_released_and_expired_only(viewer, settings):
    settings.LOCKS = {"BACKEND": "tests.test_admin.ListingStore", "ALLOW_IN_MEMORY_STORAGE": True}
    locks.store.acquire("a:held", "o1", 60_000)
    html = viewer.get(URL).content.decode()
    assert filter_links(html) == ["All", "Held (1)", "Released (0)", "Expired (0)"]
    assert viewer.get(URL, {"refresh": "5"}).content.decode().count('data-seconds="5"') == 1


class UnlistableStore(LockStore):
    pass


@pytest.mark.django_db
def test_a_store_that_cannot_list_shows_a_message(viewer, settings):
    settings.LOCKS = {"BACKEND": "tests.test_admin.UnlistableStore"}
    html = viewer.get(URL).content.decode()
    assert "The lock store UnlistableStore cannot list its leases." in html
    assert "The store lists no lease." in html


@pytest.mark.redis
@pytest.mark.django_db
def test_redis_page_shows_no_filter_it_cannot_fill(redis_server, releaser, settings):
    settings.LOCKS = {
        "BACKEND": "django_locks.stores.RedisStore",
        "OPTIONS": {"url": redis_server.url},
    }
    store = locks.store
    try:
        store.clear()
        token = store.acquire("redis:page", f"{OWNER}-1", 60_000)
        store.acquire("redis:gone", f"{OWNER}-2", 60_000)
        store.release("redis:gone", f"{OWNER}-2")
        html = releaser.get(URL).content.decode()
        assert rows(html) == [("redis:page", "held")]
        assert 'id="changelist-filter"' not in html and "By state" not in html
        assert "Expired" not in html and "Released (" not in html
        assert f'<td class="field-fencing_token">{token}</td>' in html
        assert f"Leases of the lock store Redis 127.0.0.1:{redis_server.port}" in html
        assert OWNER not in html
        releaser.post(
            URL, {"action": "release_selected", "_selected_action": ["redis:page"], "post": "yes"}
        )
        assert store.leases() == []
        assert LogEntry.objects.get().object_id == "redis:page"
    finally:
        store.clear()
        store.close()


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.35, "350ms"),
        (29, "29s"),
        (250, "4m 10s"),
        (3600, "1h"),
        (2 * 86400 + 3 * 3600 + 5, "2d 3h"),
    ],
)
def test_short_durations(seconds, shown):
    assert short_duration(datetime.timedelta(seconds=seconds)) == shown


# LOCKS["KEY_PREFIX"]: another project's leases share the store.

PREFIXED = {"BACKEND": "django_locks.stores.DatabaseStore", "KEY_PREFIX": "a:"}
MEMORY_BACKEND = "django_locks.stores.InMemoryStore"


@pytest.fixture
def two_projects(settings: Any) -> Iterator[LockStore]:
    """The database store on SQLite under the key prefix ``a:``, with held leases of ours
    (``a:``), of another project (``b:``) and of one without a prefix, and an ended one of
    ours; and a key of ours taken with permits."""
    settings.LOCKS = PREFIXED
    put("a:held:export", token=11, kind="worker", detail="nightly")
    put("a:held:report", token=12)
    put("A:held:export", token=13)  # another project: keys are compared exactly
    put("b:held:export", token=14)
    put("held:export", token=15)
    put("a:released:clean", token=16, ended="release", minutes=1)
    store = locks.store
    for n in range(2):
        grant = store.acquire_permit("a:pool", f"{OWNER}-{n}", 60_000, 3, Holder.parse("w:1"))
        assert grant is not None
    yield store
    store.clear()
    store.close()


@DB
def test_the_page_lists_only_the_prefixs_keys_without_it(releaser, two_projects):
    html = releaser.get(URL).content.decode()
    assert sorted(listed(html)) == [
        "held:export",
        "held:report",
        "pool",
        "pool#1",
        "pool#2",
        "released:clean",
    ]
    # Never shown (a checkbox's value is the row's primary key, what Django's action selects by).
    assert "a:held" not in re.sub(r'value="[^"]*"', "", html)
    assert "b:held" not in html and "A:held" not in html
    assert 'aria-label="Select this object for an action - held:export"' in html
    assert "7 leases" not in html and "6 leases" in html
    assert 'key prefix a: (LOCKS["KEY_PREFIX"]), shown without it.' in html
    assert 'data-key="pool#1">pool</span> <span class="lease-permit">permit 1 of 3' in html


@DB
def test_search_looks_into_the_key_without_the_prefix(viewer, two_projects):
    assert listed(viewer.get(URL, {"q": "export"}).content.decode()) == ["held:export"]
    assert listed(viewer.get(URL, {"q": "a:"}).content.decode()) == []  # the prefix itself
    assert listed(viewer.get(URL, {"q": "nightly"}).content.decode()) == ["held:export"]
    held = viewer.get(URL, {"state": "held"}).content.decode()
    assert sorted(listed(held)) == ["held:export", "held:report", "pool", "pool#1", "pool#2"]


@DB
def test_release_frees_the_prefixed_key_and_leaves_the_others(releaser, two_projects):
    selected = {"action": "release_selected", "_selected_action": ["a:held:export"]}
    page = releaser.post(URL, selected).content.decode()
    assert "<li>held:export: held by " in page
    assert 'name="_selected_action" value="a:held:export"' in page  # posted back as selected
    assert releaser.post(URL, {**selected, "post": "yes"}).status_code == 302
    ours = Lease.objects.get(key="a:held:export")
    assert ours.released_at is not None and ours.ended_by == "admin releaser"
    for other in ("b:held:export", "A:held:export", "held:export", "a:held:report"):
        assert Lease.objects.get(key=other).released_at is None, other
    entry = LogEntry.objects.get()
    assert entry.object_repr == "held:export"
    # Another project's key posted by hand is no row of this page: nothing is released.
    forged = {"action": "release_selected", "_selected_action": ["b:held:export"], "post": "yes"}
    follow = releaser.post(URL, forged, follow=True).content.decode()
    assert "Not held any more, nothing to release: b:held:export" in follow
    assert Lease.objects.get(key="b:held:export").released_at is None


@DB
def test_releasing_a_summary_under_a_prefix_frees_its_slots(releaser, two_projects):
    selected = {"action": "release_selected", "_selected_action": ["a:pool"], "post": "yes"}
    follow = releaser.post(URL, selected, follow=True).content.decode()
    assert "Freed every permit of pool: 2 were held." in follow
    assert [info.key for info in locks.leases()] == ["held:export", "held:report"]


@DB
def test_the_listing_page_keeps_to_the_prefix_too(releaser, settings):
    settings.LOCKS = {
        "BACKEND": MEMORY_BACKEND,
        "ALLOW_IN_MEMORY_STORAGE": True,
        "KEY_PREFIX": "a:",
    }
    store = locks.store
    for key in ("a:held:export", "a:held:report", "b:held:export", "held:export"):
        assert isinstance(store.acquire_as(key, f"{OWNER}-{key}", 60_000, Holder.parse("w:1")), int)
    html = releaser.get(URL).content.decode()
    assert listed(html) == ["held:export", "held:report"]
    assert checkboxes(html) == ["held:export", "held:report"]
    assert listed(releaser.get(URL, {"q": "report"}).content.decode()) == ["held:report"]
    assert listed(releaser.get(URL, {"q": "a:"}).content.decode()) == []
    selected = {"action": "release_selected", "_selected_action": ["held:export"], "post": "yes"}
    assert releaser.post(URL, selected).status_code == 302
    assert store.lease("a:held:export") is None
    assert store.lease("b:held:export") is not None and store.lease("held:export") is not None
    assert store.lease("a:held:report") is not None
