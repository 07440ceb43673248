"""The admin's Leases page against Django's own changelist: ``python -m benchmarks --admin``.

On the benchmark's PostgreSQL, a ``Lease`` table of 100,000 ended rows and 100 held ones; the
Leases page (the database store's changelist) and a plain ``ModelAdmin`` on ``Lease`` on a second
admin site (``admin_urls.py``: a ``SimpleListFilter`` with the same WHERE, the same ordering, 100
rows a page and the full result count) are loaded through ``django.test.Client`` as a logged-in
superuser, unfiltered and filtered to held, in interleaved turns; the medians are compared (the
goal: at most 1.5x). The queries each page runs are counted too.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any

from benchmarks import environment
from benchmarks.measure import table

ENDED = 100_000
HELD = 100
GOAL = 1.5
PAGES = {"unfiltered": "", "held": "?state=held"}
SITES = {
    "Leases page": "/admin/django_locks/lease/",
    "plain ModelAdmin": "/plain/django_locks/lease/",
}
OURS, PLAIN = SITES


@dataclasses.dataclass(frozen=True)
class AdminPlan:
    loads: int = 20
    warmup: int = 3


QUICK = AdminPlan(loads=3, warmup=1)


def say(text: str = "") -> None:
    print(text, flush=True)


def configure(server: Any) -> None:
    """Django with the admin, on the benchmark's PostgreSQL (alias ``default``), migrated."""
    import django
    from django.conf import settings
    from django.core.management import call_command

    settings.configure(
        DEBUG=False,
        USE_TZ=True,
        SECRET_KEY="django_locks-benchmarks",
        ALLOWED_HOSTS=["testserver"],
        INSTALLED_APPS=[
            "django.contrib.admin",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "django_locks",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.common.CommonMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
        ],
        ROOT_URLCONF="benchmarks.admin_urls",
        TEMPLATES=[
            {
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "APP_DIRS": True,
                "OPTIONS": {
                    "context_processors": [
                        "django.template.context_processors.request",
                        "django.contrib.auth.context_processors.auth",
                        "django.contrib.messages.context_processors.messages",
                    ]
                },
            }
        ],
        DATABASES={"default": server.database_settings(environment.DATABASE)},
        LOCKS={"BACKEND": "django_locks.stores.DatabaseStore"},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        LOGGING_CONFIG=None,
    )
    django.setup()
    call_command("migrate", verbosity=0)


def run(server: Any, plan: AdminPlan) -> dict[str, Any]:
    """Fill the table, load both changelists ``plan.loads`` times each in turns; the figures."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from tests.lease_rows import fill

    started = time.perf_counter()
    fill("default", ended=ENDED, held=HELD)
    filled = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*), current_setting('server_version') FROM django_locks_lease")
        rows, version = cursor.fetchone()
    say(f"== The admin's Leases page, PostgreSQL {version} ==")
    say()
    say(
        f"{rows:,} lease rows ({ENDED:,} ended, {HELD} held; written in {filled:.1f}s, then "
        "ANALYZE), loaded through django.test.Client as a logged-in superuser."
    )
    user = get_user_model().objects.create_superuser("bench", "bench@example.com", "pw")
    client = Client()
    client.force_login(user)

    def load(url: str) -> tuple[float, bytes]:
        start = time.perf_counter()
        response = client.get(url)
        elapsed = time.perf_counter() - start
        if response.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {response.status_code}")
        return elapsed, response.content

    urls = {
        (site, page): base + query for site, base in SITES.items() for page, query in PAGES.items()
    }
    figures: dict[str, Any] = {"rows": rows, "ended": ENDED, "held": HELD, "loads": plan.loads}
    pages: dict[str, Any] = {}
    for (site, page), url in urls.items():
        with CaptureQueriesContext(connection) as queries:
            _, content = load(url)
        pages.setdefault(page, {})[site] = {
            "queries": len(queries),
            "rows_shown": content.count(b'<td class="action-checkbox">'),
        }
    for _ in range(plan.warmup):
        for url in urls.values():
            load(url)
    samples: dict[tuple[str, str], list[float]] = {key: [] for key in urls}
    for turn in range(plan.loads):
        for page in PAGES:
            order = [OURS, PLAIN] if turn % 2 == 0 else [PLAIN, OURS]
            for site in order:
                samples[site, page].append(load(urls[site, page])[0])
    table_rows = []
    for page in PAGES:
        found = pages[page]
        for site in SITES:
            values = samples[site, page]
            found[site].update(
                median_ms=round(statistics.median(values) * 1e3, 2),
                min_ms=round(min(values) * 1e3, 2),
                max_ms=round(max(values) * 1e3, 2),
            )
        ratio = found[OURS]["median_ms"] / found[PLAIN]["median_ms"]
        found["ratio"] = round(ratio, 3)
        found["met"] = ratio <= GOAL
        for site in SITES:
            entry = found[site]
            table_rows.append(
                [
                    f"{page}: {site}",
                    f"{entry['median_ms']:.1f} ms",
                    f"{entry['min_ms']:.1f} to {entry['max_ms']:.1f} ms",
                    str(entry["queries"]),
                    str(entry["rows_shown"]),
                    f"{ratio:.2f}x" if site == OURS else "",
                ]
            )
    figures["pages"] = pages
    say(
        f"Changelist loads, {plan.loads} interleaved each (medians; the Leases page against a "
        "plain ModelAdmin with the same WHERE, ordering, page size and full count; the queries "
        "of one load, the session's and the user's included):"
    )
    say(table(["", "median", "range", "queries", "rows", "ratio"], table_rows))
    say()
    say("== Against the goal ==")
    say(
        table(
            ["page", "goal", "measured", ""],
            [
                [
                    page,
                    f"Leases page <= {GOAL}x a plain ModelAdmin",
                    f"{pages[page]['ratio']:.2f}x ({pages[page][OURS]['median_ms']:.1f} ms)",
                    "met" if pages[page]["met"] else "MISSED",
                ]
                for page in PAGES
            ],
            left=2,
        )
    )
    return figures


def main(*, quick: bool) -> dict[str, Any]:
    """Start PostgreSQL, set Django up on it, measure; the figures (``results["admin"]``)."""
    with environment.servers({"postgres"}) as servers:
        configure(servers["postgres"])
        try:
            return run(servers["postgres"], QUICK if quick else AdminPlan())
        finally:
            from django.db import connections

            connections.close_all()
