"""The admin's Leases page in a real browser: Debian's Chromium, driven by Playwright, against a
live server on the database store. On SQLite: it logs in, finds leases in every state (held,
ended each way, force released), reads holders and keys as people read them, searches, filters,
sorts, refreshes by itself when asked, and releases a lease through the action and its
confirmation page. On PostgreSQL: the same page over 100,000 ended rows and 100 held ones.

Screenshots of each step are written under the test run's output directory,
``<basetemp>/screenshots/admin-leases-*.png`` (pytest's ``--basetemp``, else its temporary
directory of the run); each path is logged (logger ``tests.browser``) and listed on the terminal
at the end of the test.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.staticfiles.handlers import StaticFilesHandler
from django.db import connections

from django_locks.models import Lease
from django_locks.service import locks
from tests.lease_rows import EXPECTED, OWNER, fill, put_every_state

pytestmark = [pytest.mark.browser]

logger = logging.getLogger("tests.browser")

URL = "/admin/django_locks/lease/"
WIDE = {"width": 1920, "height": 1080}  # an operator's screen: every column in view
LONG_KEY = "report:customer-48213:monthly-statement:2026-11/invoice.pdf#page-2"

# Where each line of a key cell breaks: the character before each break.
KEY_BREAKS = """(cell) => {
    const breaks = [];
    let top = null, before = null;
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        for (let i = 0; i < node.length; i++) {
            const range = document.createRange();
            range.setStart(node, i);
            range.setEnd(node, i + 1);
            const rect = range.getBoundingClientRect();
            if (!rect.width) continue;
            if (top !== null && rect.top > top + 2) breaks.push(before);
            top = rect.top;
            before = node.data[i];
        }
    }
    return breaks;
}"""


class Screenshots:
    """Full-page screenshots under ``<basetemp>/screenshots``, each path logged as it is
    written and all of them listed on the terminal when the test ends."""

    def __init__(self, directory: Path, test: str) -> None:
        self.directory = directory
        self.test = test
        self.paths: list[Path] = []

    def __call__(self, page: Any, name: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"admin-leases-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        self.paths.append(path)
        logger.info("screenshot %s", path)
        print(f"screenshot: {path}")


@pytest.fixture
def shot(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Screenshots]:
    shots = Screenshots(tmp_path_factory.getbasetemp() / "screenshots", request.node.name)
    yield shots
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"Screenshots of {shots.test}:", *(f"  {path}" for path in shots.paths)]
    index = shots.directory / f"{shots.test}.txt"
    if shots.paths:
        index.write_text("\n".join(str(path) for path in shots.paths) + "\n")
    for line in lines:
        logger.info(line)
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # on the terminal, past pytest's capture
            reporter.write_line("")
            for line in lines:
                reporter.write_line(line)


def serve(settings: Any, locks_settings: dict[str, Any]) -> Iterator[str]:
    """A live server of the test project, serving the admin's and django_locks' static files
    (found in the apps' ``static`` directories), with ``LOCKS`` as given."""
    from pytest_django.live_server_helper import LiveServer

    settings.STATIC_URL = "/static/"
    settings.LOCKS = locks_settings
    server = LiveServer("127.0.0.1:0", start=False)
    server.thread.static_handler = StaticFilesHandler
    server.start()
    try:
        yield server.url
    finally:
        server.stop()
        locks.store.close()


@pytest.fixture
def sqlite_live_server(settings: Any, transactional_db: None) -> Iterator[str]:
    """The live server on the database store on SQLite (``default``)."""
    yield from serve(settings, {"BACKEND": "django_locks.stores.DatabaseStore"})


@pytest.fixture
def pg_live_server(settings: Any, postgres_server: Any) -> Iterator[str]:
    """The live server on the database store on the session's PostgreSQL (``postgres``)."""
    yield from serve(
        settings, {"BACKEND": "django_locks.stores.DatabaseStore", "OPTIONS": {"using": "postgres"}}
    )


def rows(page: Any) -> dict[str, str]:
    """The listed leases: key -> the state shown in its row."""
    found = {}
    for row in page.locator("#result_list tbody tr").all():
        found[row.locator("td.field-lease_key").inner_text()] = row.locator(
            "td.field-state"
        ).inner_text()
    return found


def log_in(page: Any, base: str, shot: Screenshots, name: str) -> None:
    """As ``operator``: the admin sends an anonymous browser to its login page first."""
    page.goto(f"{base}{URL}")
    assert "/admin/login/" in page.url
    page.fill("#id_username", "operator")
    page.fill("#id_password", "s3cret-pw")
    shot(page, name)
    page.click("input[type=submit]")
    page.wait_for_selector("#result_list")


@pytest.mark.django_db(transaction=True)
def test_every_state_search_filter_sort_refresh_and_release(
    sqlite_live_server, chromium, django_user_model, shot
):
    django_user_model.objects.create_superuser("operator", "ops@example.com", "s3cret-pw")
    put_every_state()
    lock = locks.acquire(LONG_KEY, ttl="20m")
    assert lock is not None
    page = chromium.new_page()
    page.set_viewport_size(WIDE)
    log_in(page, sqlite_live_server, shot, "1-login")

    assert page.locator("h1").inner_text() == "Leases"
    # The admin's own stylesheets are applied (the page looks like the rest of the admin).
    assert page.locator("#changelist-filter").is_visible()
    assert 'Leases of the lock store SQLite "default"' in page.locator(".lease-store").inner_text()
    shown = rows(page)
    assert list(shown) == [LONG_KEY, *EXPECTED]  # held first (latest expiry), then the ends
    labels = {state: label for state, label in (
        ("held", "Held"), ("expired", "Expired"), ("lapsed", "Lapsed"),
        ("handed back", "Handed back"), ("released", "Released"), ("max hold", "Max hold"),
    )}  # fmt: skip
    for key, state in EXPECTED.items():
        expected = "Force released by admin alice" if state == "force released" else labels[state]
        assert shown[key] == expected, key
    # Only held leases can be selected; the owner id is nowhere on the page.
    assert page.locator("input.action-select").count() == 3
    assert OWNER not in page.content() and lock.owner not in page.content()
    # The holder on one line, its whole description in the title.
    held_row = page.locator("#result_list tbody tr").first
    holder = held_row.locator("td.field-lease_holder .lease-holder")
    assert holder.evaluate("el => el.getClientRects().length") == 1
    assert re.fullmatch(r".+ pid \d+( \(.*\))?", holder.inner_text())
    assert "unless renewed" in (holder.get_attribute("title") or "")
    assert re.fullmatch(r"in 19m 5\d+s", held_row.locator("td.field-ends").inner_text())
    assert held_row.locator("td.field-fencing_token").inner_text() == str(lock.fencing_token)
    shot(page, "2-every-state")

    # A narrow window: the long key wraps, and only after its separators.
    page.set_viewport_size({"width": 760, "height": 900})
    key_cell = held_row.locator("td.field-lease_key")
    breaks = key_cell.evaluate(KEY_BREAKS)
    assert breaks and set(breaks) <= set(":/.#"), breaks
    assert key_cell.inner_text() == LONG_KEY
    shot(page, "3-narrow-keys-wrap-at-separators")
    page.set_viewport_size(WIDE)

    # Search by key or holder.
    page.fill("#searchbar", "HANDED")
    page.press("#searchbar", "Enter")
    page.wait_for_url(re.compile(r"q=HANDED"))
    assert list(rows(page)) == ["handed-back:grace", "handed-back:shutdown"]
    shot(page, "4-search")

    # Filter by how a lease ended (the search cleared first).
    page.goto(f"{sqlite_live_server}{URL}")
    page.click("#changelist-filter >> text=Lapsed")
    page.wait_for_url(re.compile(r"state=lapsed"))
    assert rows(page) == {"lapsed:min-hold": "Lapsed"}
    assert page.locator("#changelist-filter li.selected").inner_text() == "Lapsed"
    shot(page, "5-filter-lapsed")

    # Sort by key, a click on its header.
    page.goto(f"{sqlite_live_server}{URL}")
    page.click("#result_list thead th.column-lease_key a")
    page.wait_for_url(re.compile(r"o=1"))
    assert list(rows(page)) == sorted([LONG_KEY, *EXPECTED])
    shot(page, "6-sorted-by-key")

    # Refresh every 5 s: the page reloads itself, and keeps the filter.
    page.goto(f"{sqlite_live_server}{URL}?state=held")
    page.click("text=Refresh every 5 s")
    page.wait_for_url(re.compile(r"refresh=5"))
    page.evaluate("window.notReloaded = true")
    started = time.monotonic()
    page.wait_for_function("!window.notReloaded", timeout=15_000)
    assert 3 < time.monotonic() - started < 15
    assert "refresh=5" in page.url and "state=held" in page.url
    assert "Refreshed every 5 seconds." in page.locator(".lease-store").inner_text()
    shot(page, "7-refreshing")
    page.click("text=Stop refreshing")
    page.wait_for_url(lambda url: "refresh" not in url)

    # Release one held lease: select it, pick the action, confirm.
    page.check(f'input.action-select[value="{LONG_KEY}"]')
    assert page.locator(".action-counter").inner_text() == "1 of 3 selected"  # admin's actions.js
    page.select_option("select[name=action]", "release_selected")
    page.click("button[name=index]")
    page.wait_for_selector("#release-summary")
    summary = page.locator("#release-summary").inner_text()
    assert f"fencing token {lock.fencing_token}" in summary
    assert Lease.objects.get(key=LONG_KEY).released_at is None
    shot(page, "8-confirm")
    page.click("input[type=submit][value^=Yes]")
    page.wait_for_selector(".messagelist")
    assert "Released 1 lease" in page.locator(".messagelist").inner_text()
    assert LONG_KEY not in rows(page)  # still filtered on held
    shot(page, "9-released")
    page.click("#changelist-filter >> text=Force released")
    page.wait_for_url(re.compile(r"state=force"))
    assert rows(page) == {
        LONG_KEY: "Force released by admin operator",
        "force-released:alice": "Force released by admin alice",
    }
    shot(page, "10-force-released")
    entry = LogEntry.objects.get()
    assert (entry.object_id, entry.user.username) == (LONG_KEY, "operator")
    lock.release()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
def test_the_page_over_100000_ended_rows(pg_live_server, chromium, django_user_model, shot):
    django_user_model.objects.create_superuser("operator", "ops@example.com", "s3cret-pw")
    started = time.perf_counter()
    try:
        fill("postgres", ended=100_000, held=100)
    finally:
        # Playwright's sync API runs this test in a context of its own, where Django made a
        # connection of its own, which pytest-django's teardown would not close.
        connections["postgres"].close()
    logger.info(
        "100,000 ended rows and 100 held ones written in %.2fs", time.perf_counter() - started
    )
    page = chromium.new_page()
    page.set_viewport_size(WIDE)
    log_in(page, pg_live_server, shot, "100k-0-login")
    assert 'PostgreSQL "postgres"' in page.locator(".lease-store").inner_text()
    assert page.locator("#result_list tbody tr").count() == 100
    assert "100100 leases" in page.locator("p.paginator").inner_text()
    shown = rows(page)
    assert all(state == "Held" for state in shown.values())  # held first
    shot(page, "100k-1-first-page")

    timings = {}
    # 100 held rows, then 50,000 expired ones (released_at NULL), then 50,000 released.
    for name, query in (("unfiltered", ""), ("held", "?state=held"), ("page 1000", "?p=1000")):
        started = time.perf_counter()
        page.goto(f"{pg_live_server}{URL}{query}")
        page.wait_for_selector("#result_list")
        timings[name] = time.perf_counter() - started
    logger.info("page loads: %s", {k: f"{v * 1000:.0f} ms" for k, v in timings.items()})
    assert set(rows(page).values()) == {"Released", "Handed back"}
    shot(page, "100k-2-page-1000")

    page.goto(f"{pg_live_server}{URL}?state=held")
    assert page.locator("#result_list tbody tr").count() == 100
    assert "100 leases" in page.locator("p.paginator").inner_text()
    shot(page, "100k-3-held")
    page.click("#changelist-filter >> text=Expired")
    page.wait_for_url(re.compile(r"state=expired"))
    assert set(rows(page).values()) == {"Expired"}
    assert "25000 leases" in page.locator("p.paginator").inner_text()
    shot(page, "100k-4-expired")
