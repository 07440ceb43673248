"""The admin's Leases page in a real browser: Debian's Chromium, driven by Playwright, against a
live server on the database store. It logs in, finds leases in every state, searches, filters,
and releases one through the action and its confirmation page.

Screenshots of each step are saved under artifacts/screenshots/ (admin-leases-*.png).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.staticfiles.handlers import StaticFilesHandler

from django_locks.service import locks
from tests.helpers import eventually

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SCREENSHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"


@pytest.fixture
def admin_server(settings: Any, transactional_db: None) -> Iterator[str]:
    """A live server of the test project, serving the admin's static files (found in the apps'
    ``static`` directories); the configured store is the database store on SQLite."""
    from pytest_django.live_server_helper import LiveServer

    settings.STATIC_URL = "/static/"
    settings.LOCKS = {"BACKEND": "django_locks.stores.DatabaseStore"}
    server = LiveServer("127.0.0.1:0", start=False)
    server.thread.static_handler = StaticFilesHandler
    server.start()
    try:
        yield server.url
    finally:
        server.stop()
        locks.store.clear()
        locks.store.close()


def shot(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"admin-leases-{name}.png"), full_page=True)


def rows(page: Any) -> dict[str, str]:
    """The listed leases: key -> the state shown in its row."""
    found = {}
    for row in page.locator("#result_list tbody tr").all():
        found[row.locator("th.field-key").inner_text()] = row.locator("td.field-state").inner_text()
    return found


def test_log_in_search_filter_and_release(admin_server, chromium, django_user_model):
    django_user_model.objects.create_superuser("operator", "ops@example.com", "s3cret-pw")
    store = locks.store
    tokens = {
        "invoices:nightly-export": store.acquire("invoices:nightly-export", "web-1", 600_000),
        "inventory:warehouse-feed": store.acquire("inventory:warehouse-feed", "worker-2", 600_000),
        "reports:weekly": store.acquire("reports:weekly", "cron-3", 60),
        "cache:warmup": store.acquire("cache:warmup", "web-2", 600_000),
    }
    store.release("cache:warmup", "web-2")
    eventually(lambda: len(store.leases()) == 2, what="reports:weekly to expire")
    page = chromium.new_page()

    # Anonymous: the admin sends the browser to its login page.
    page.goto(f"{admin_server}/admin/django_locks/lease/")
    assert "/admin/login/" in page.url
    page.fill("#id_username", "operator")
    page.fill("#id_password", "s3cret-pw")
    shot(page, "1-login")
    page.click("input[type=submit]")
    page.wait_for_selector("#result_list")
    assert page.locator("h1").inner_text() == "Leases"
    # The admin's own stylesheets are applied (the page looks like the rest of the admin).
    assert page.evaluate("getComputedStyle(document.querySelector('#changelist')).display")
    assert page.locator("#changelist-filter").is_visible()
    assert rows(page) == {
        "inventory:warehouse-feed": "Held",
        "invoices:nightly-export": "Held",
        "reports:weekly": "Expired",
        "cache:warmup": "Released",
    }
    held_row = page.locator("#result_list tbody tr").first
    assert re.fullmatch(r"in 9m 5\d+s", held_row.locator("td.field-expires_in").inner_text())
    assert "process" in held_row.locator("td.field-holder").inner_text()
    assert held_row.locator("td.field-fencing_token").inner_text() == str(
        tokens["inventory:warehouse-feed"]
    )
    shot(page, "2-list")

    # Search by key.
    page.fill("#searchbar", "INVOICES")
    page.press("#searchbar", "Enter")
    page.wait_for_url(re.compile(r"q=INVOICES"))
    assert list(rows(page)) == ["invoices:nightly-export"]
    shot(page, "3-search")

    # Filter by state (clearing the search first).
    page.goto(f"{admin_server}/admin/django_locks/lease/")
    page.click("#changelist-filter >> text=Expired (1)")
    page.wait_for_url(re.compile(r"state=expired"))
    assert rows(page) == {"reports:weekly": "Expired"}
    assert page.locator("#changelist-filter li.selected").inner_text() == "Expired (1)"
    shot(page, "4-filter")

    # Release one held lease: select it, pick the action, confirm.
    page.click("#changelist-filter >> text=Held (2)")
    page.wait_for_url(re.compile(r"state=held"))
    page.check('input.action-select[value="invoices:nightly-export"]')
    assert page.locator(".action-counter").inner_text() == "1 of 2 selected"  # admin's actions.js
    page.select_option("select[name=action]", "release_selected")
    page.click("button[name=index]")
    page.wait_for_selector("#release-summary")
    summary = page.locator("#release-summary").inner_text()
    assert f"fencing token {tokens['invoices:nightly-export']}" in summary
    assert [lease.key for lease in store.leases()] == [
        "inventory:warehouse-feed",
        "invoices:nightly-export",
    ]
    shot(page, "5-confirm")
    page.click("input[type=submit][value^=Yes]")
    page.wait_for_selector(".messagelist")
    assert "Released 1 lease" in page.locator(".messagelist").inner_text()
    assert rows(page) == {"inventory:warehouse-feed": "Held"}  # still filtered on held
    shot(page, "6-released")
    page.click("#changelist-filter >> text=All")
    page.wait_for_selector("#result_list")
    assert rows(page)["invoices:nightly-export"] == "Released"
    shot(page, "7-all")

    assert [lease.key for lease in store.leases()] == ["inventory:warehouse-feed"]
    entry = LogEntry.objects.get()
    assert (entry.object_id, entry.user.username) == ("invoices:nightly-export", "operator")
