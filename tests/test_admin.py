"""The admin's Leases page through Django's test client: what it lists, search and filter,
read-only, permissions, the release action and its admin log, and the store's alias whatever the
routers say. (tests/test_admin_browser.py drives it in a real browser.)"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from django_locks.admin import short_duration
from django_locks.service import locks
from django_locks.stores.base import LeaseInfo, LockStore
from django_locks.testing import ManualClock

URL = "/admin/django_locks/lease/"

pytestmark = pytest.mark.django_db


@pytest.fixture
def clock(settings: Any) -> Iterator[ManualClock]:
    """The configured service on an in-memory store whose clock moves only when told."""
    clock = ManualClock()
    settings.LOCKS = {
        "BACKEND": "django_locks.stores.InMemoryStore",
        "ALLOW_IN_MEMORY_STORAGE": True,
        "CLOCK": clock,
    }
    yield clock


@pytest.fixture
def leases(clock: ManualClock) -> dict[str, int]:
    """Leases in every state: two held, one expired, one released; their tokens by key."""
    store = locks.store
    tokens = {
        "invoices:nightly-export": store.acquire(
            "invoices:nightly-export", "owner-secret-1", 60_000
        ),
        "inventory:feed": store.acquire("inventory:feed", "owner-secret-2", 60_000),
        "reports:weekly": store.acquire("reports:weekly", "owner-secret-3", 1_000),
        "cache:warmup": store.acquire("cache:warmup", "owner-secret-4", 60_000),
    }
    store.release("cache:warmup", "owner-secret-4")
    clock.advance("2s")
    return {key: int(token) for key, token in tokens.items() if token is not None}


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


def listed_keys(html: str) -> list[str]:
    return re.findall(r'<tr class="lease-\w+" data-key="([^"]+)"', html)


def states(html: str) -> dict[str, str]:
    return {
        key: state for state, key in re.findall(r'<tr class="lease-(\w+)" data-key="([^"]+)"', html)
    }


def test_lists_every_state_held_first(viewer, leases):
    response = viewer.get(URL)
    assert response.status_code == 200
    html = response.content.decode()
    assert listed_keys(html) == [
        "inventory:feed",
        "invoices:nightly-export",
        "reports:weekly",
        "cache:warmup",
    ]
    assert states(html) == {
        "inventory:feed": "held",
        "invoices:nightly-export": "held",
        "reports:weekly": "expired",
        "cache:warmup": "released",
    }
    # Expiry is relative, measured on the store's clock (the manual one moved 2s).
    assert "in 58s" in html
    assert "expired 1s ago" in html
    assert f'<td class="field-fencing_token">{leases["reports:weekly"]}</td>' in html
    assert "process " in html  # the holder shows its host and process id
    assert "owner-secret" not in html  # the owner id is the holder's secret


def test_search_by_key_and_filter_by_state(viewer, leases):
    html = viewer.get(URL, {"q": "INV"}).content.decode()
    assert listed_keys(html) == ["inventory:feed", "invoices:nightly-export"]
    html = viewer.get(URL, {"state": "expired"}).content.decode()
    assert listed_keys(html) == ["reports:weekly"]
    html = viewer.get(URL, {"state": "released", "q": "cache"}).content.decode()
    assert listed_keys(html) == ["cache:warmup"]
    assert "Released (1)" in html and "Held (0)" in html  # counts follow the search
    assert viewer.get(URL, {"q": "nothing-like-it"}).content.decode().count("No lease matches") == 1


def test_pages_of_leases(viewer, leases, monkeypatch):
    from django_locks.admin import LeaseAdmin

    monkeypatch.setattr(LeaseAdmin, "list_per_page", 3)
    first = viewer.get(URL).content.decode()
    assert len(listed_keys(first)) == 3
    assert '<a href="?p=2">2</a>' in first and "4 leases" in first
    assert listed_keys(viewer.get(URL, {"p": "2"}).content.decode()) == ["cache:warmup"]


def test_read_only_no_add_change_or_delete(viewer, leases):
    index = viewer.get(reverse("admin:index")).content.decode()
    assert URL in index
    assert f"{URL}add/" not in index
    assert viewer.get(f"{URL}add/").status_code == 404
    assert viewer.get(f"{URL}inventory:feed/change/").status_code == 404
    assert viewer.get(f"{URL}inventory:feed/delete/").status_code == 404


def test_anonymous_users_are_sent_to_the_login_page(client, leases):
    response = client.get(URL)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def test_staff_without_the_view_permission_get_403(client, django_user_model, leases):
    client.force_login(user(django_user_model, "staff"))
    assert client.get(URL).status_code == 403
    assert URL not in client.get(reverse("admin:index")).content.decode()


def test_without_the_release_permission_there_is_no_action(viewer, leases):
    html = viewer.get(URL).content.decode()
    assert 'name="action"' not in html
    assert "_selected_action" not in html


def test_a_forged_release_post_is_refused(viewer, leases):
    for post in ({}, {"post": "yes"}):
        response = viewer.post(
            URL, {"action": "release_selected", "_selected_action": ["inventory:feed"], **post}
        )
        assert response.status_code == 403
    assert [lease.key for lease in locks.store.leases()] == [
        "inventory:feed",
        "invoices:nightly-export",
    ]
    assert not LogEntry.objects.exists()


def test_release_action_confirms_then_releases_and_logs(releaser, leases):
    html = releaser.get(URL).content.decode()
    assert '<option value="release_selected">Release selected leases</option>' in html
    selected = {"action": "release_selected", "_selected_action": ["inventory:feed"]}

    confirm = releaser.post(f"{URL}?state=held", selected)
    assert confirm.status_code == 200
    page = confirm.content.decode()
    assert "Are you sure" in page
    assert f"fencing token {leases['inventory:feed']}" in page
    assert locks.store.leases()[0].key == "inventory:feed"  # nothing released yet

    done = releaser.post(f"{URL}?state=held", {**selected, "post": "yes"})
    assert done.status_code == 302
    assert done["Location"] == f"{URL}?state=held"
    assert [lease.key for lease in locks.store.leases()] == ["invoices:nightly-export"]
    entry = LogEntry.objects.get()
    assert (entry.object_id, entry.object_repr, entry.action_flag) == (
        "inventory:feed",
        "inventory:feed",
        CHANGE,
    )
    assert f"fencing token {leases['inventory:feed']}" in entry.change_message
    assert entry.user.username == "releaser"
    follow = releaser.get(done["Location"]).content.decode()
    assert "Released 1 lease" in follow
    # The index's "Recent actions" shows it (without a link: there is no change page).
    index = releaser.get(reverse("admin:index"))
    assert index.status_code == 200 and "inventory:feed" in index.content.decode()
    # The key keeps its token: the next holder's is greater.
    token = locks.store.acquire("inventory:feed", "o9", 60_000)
    assert token is not None and token > leases["inventory:feed"]


def test_releasing_a_lease_no_longer_held_says_so(releaser, leases):
    response = releaser.post(
        URL,
        {"action": "release_selected", "_selected_action": ["reports:weekly"], "post": "yes"},
        follow=True,
    )
    assert "Not held any more, nothing to release: reports:weekly" in response.content.decode()
    assert not LogEntry.objects.exists()


def test_action_without_selection_or_action_changes_nothing(releaser, leases):
    response = releaser.post(URL, {"action": "release_selected"}, follow=True)
    assert "Items must be selected" in response.content.decode()
    response = releaser.post(
        URL, {"action": "", "_selected_action": ["inventory:feed"]}, follow=True
    )
    assert "No action selected" in response.content.decode()
    assert len(locks.store.leases()) == 2


class UnlistableStore(LockStore):
    pass


def test_a_store_that_cannot_list_shows_a_message(viewer, settings):
    settings.LOCKS = {"BACKEND": "tests.test_admin.UnlistableStore"}
    html = viewer.get(URL).content.decode()
    assert "cannot list its leases" in html
    assert "The store lists no lease." in html


class RefuseLeases:
    """A router sending everything of django_locks to an alias that does not exist."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return "nowhere" if model._meta.app_label == "django_locks" else None

    db_for_write = db_for_read


@pytest.mark.django_db(transaction=True)
def test_database_store_reads_its_own_alias_whatever_the_routers_say(
    client, django_user_model, settings
):
    settings.LOCKS = {
        "BACKEND": "django_locks.stores.DatabaseStore",
        "OPTIONS": {"using": "default"},
    }
    try:
        token = locks.store.acquire("db:routed", "o1", 60_000)
        client.force_login(user(django_user_model, "root", superuser=True))
        settings.DATABASE_ROUTERS = ["tests.test_admin.RefuseLeases"]
        html = client.get(URL).content.decode()
        assert listed_keys(html) == ["db:routed"]
        assert f'<td class="field-fencing_token">{token}</td>' in html
        response = client.post(
            URL, {"action": "release_selected", "_selected_action": ["db:routed"], "post": "yes"}
        )
        assert response.status_code == 302
        assert locks.store.leases() == []
    finally:
        locks.store.clear()
        locks.store.close()


@pytest.mark.redis
def test_redis_leases_have_the_same_page(redis_server, client, django_user_model, settings):
    settings.LOCKS = {
        "BACKEND": "django_locks.stores.RedisStore",
        "OPTIONS": {"url": redis_server.url},
    }
    store = locks.store
    try:
        store.clear()
        token = store.acquire("redis:page", "o1", 60_000)
        client.force_login(user(django_user_model, "root", superuser=True))
        html = client.get(URL).content.decode()
        assert listed_keys(html) == ["redis:page"]
        assert states(html) == {"redis:page": "held"}
        assert f'<td class="field-fencing_token">{token}</td>' in html
        client.post(
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


def test_lease_info_without_expiry_shows_nothing():
    from django_locks.admin import describe_expiry

    lease = LeaseInfo("k", "held", "o", "h:1", 1, None, None)
    assert describe_expiry(lease) == ""
