"""Every ``.. code-block:: python`` of the documentation runs, page by page, as printed.

How a page runs:

* Its blocks run in order in one namespace, as a reader follows the page: a later block may use
  what an earlier one defined (``DATABASES`` in the PgBouncer how-to, ``StockCount`` in fencing).
* A block whose first line names a file (``# myproject/locks_sqlite.py``) runs as that module,
  registered in ``sys.modules`` for the page, so that later blocks can import it.
* A block that assigns ``LOCKS`` has it validated as Django's startup does (``conf.read``).
* Each ``test_*`` function a block defines without parameters is called (``async`` ones with
  ``asyncio.run``), so the testing guide's examples pass as tests.
* ``CHECKS`` below calls what a page defines but does not call (a view, a job, a leader), with
  the stand-ins ``NAMESPACES`` gives for names a page leaves to the reader (``warehouse_client``).
* Models are defined in an isolated app registry, under the test app (the pages' models have the
  test app's tables); the job and election registries, the signals' receivers and the leases are
  restored after each page, and each block starts with empty job registries (pages show
  alternatives under one key).

The tutorial is not run here: its snippets are the files of a new project, which
``tests/test_tutorial.py`` builds and runs as the page says.

Not runnable blocks are marked with an RST comment right before them, with the reason::

    .. sample: skip needs sentry_sdk, which the test suite does not install

They are few, and ``test_skipped_samples_are_few_and_say_why`` keeps them so. The tutorial's code
is included from ``testproject/`` (``literalinclude``), which ``tests/test_demo.py`` runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import re
import sys
import textwrap
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from django.db import connections
from django.test import RequestFactory, override_settings
from django.test.utils import isolate_apps

from django_locks import conf, leader, registry, signals
from django_locks.testing import LockStoreContract, reset_locks

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = sorted(
    str(path.relative_to(DOCS)) for path in DOCS.rglob("*.rst") if "_build" not in path.parts
)
SKIP = re.compile(r"^\.\. sample: skip (?P<reason>\S.*)$")
MODULE = re.compile(r"^#\s*(?P<path>[\w/]+)\.py\b")
MAX_SKIPPED = 6
TUTORIAL = "tutorial.rst"  # run by tests/test_tutorial.py, as a project of its own


@dataclasses.dataclass
class Block:
    page: str
    line: int
    code: str
    skip: str | None

    @property
    def module(self) -> str | None:
        match = MODULE.match(self.code)
        return match["path"].replace("/", ".") if match else None


def blocks(page: str) -> list[Block]:
    lines = (DOCS / page).read_text(encoding="utf-8").splitlines()
    found = []
    for number, line in enumerate(lines):
        if line.strip() != ".. code-block:: python":
            continue
        before = [text.strip() for text in lines[:number] if text.strip()]
        skip = SKIP.match(before[-1]) if before else None
        indent = len(line) - len(line.lstrip())
        body: list[str] = []
        for text in lines[number + 1 :]:
            if text.strip() and len(text) - len(text.lstrip()) <= indent:
                break  # the first line back at the directive's indentation ends the block
            if not body and re.match(r"^\s+:[\w-]+:", text):
                continue  # an option of the directive (``:caption:``), not code
            body.append(text)
        code = textwrap.dedent("\n".join(body)).strip("\n") + "\n"
        found.append(Block(page, number + 1, code, skip["reason"] if skip else None))
    return found


# What pages define but do not call, and the stand-ins they leave to the reader.


class Subscription:
    def __init__(self, stop: Any) -> None:
        self.stop, self.closed = stop, False

    def __iter__(self) -> Iterator[str]:
        yield from ("mug: 2 left", "cap: 0 left")

    def close(self) -> None:
        self.closed = True


class WarehouseClient:
    def subscribe(self, *, stop: Any) -> Subscription:
        return Subscription(stop)


def check_locks_page(ns: dict[str, Any]) -> None:
    response = ns["export_now"](RequestFactory().post("/export"))
    assert response.status_code == 200 and b"Exported under token" in response.content
    assert ns["exported"] == 42
    assert asyncio.run(ns["main"]()) == 3


def check_fencing_page(ns: dict[str, Any]) -> None:
    from tests.testapp.models import StockCount

    StockCount.objects.create(product="mug", count=1, fencing_token=0)
    ns["reconcile_stock"]({"mug": 3})
    row = StockCount.objects.get(product="mug")
    assert row.count == 3 and row.fencing_token > 0
    StockCount.objects.filter(product="mug").update(fencing_token=10**12)  # a newer holder
    ns["reconcile_stock"]({"mug": 5})  # refused: prints that a newer holder wrote it
    assert StockCount.objects.get(product="mug").count == 3
    # lock.atomic()'s samples, on the database store of the test database (a savepoint of the
    # test's transaction; SQLite's transaction_mode as the page says to set it).
    options = connections["default"].settings_dict.setdefault("OPTIONS", {})
    store = {"BACKEND": "django_locks.stores.DatabaseStore"}
    with override_settings(LOCKS=store), mock.patch.dict(options, transaction_mode="IMMEDIATE"):
        ns["receive_delivery"]("mug", 2)
        assert StockCount.objects.get(product="mug").count == 5
        ns["nightly_stock_count"]({"mug": 9})
        assert StockCount.objects.get(product="mug").count == 9


def check_leader_page(ns: dict[str, Any]) -> None:
    from django_locks import Locks
    from django_locks.stores import InMemoryStore

    service = Locks(InMemoryStore(), ttl="10s")
    with service.lock("inventory:warehouse-feed") as lock:
        ns["warehouse_feed"](lock)
        assert ns["recorded"] == [
            ("mug: 2 left", lock.fencing_token),
            ("cap: 0 left", lock.fencing_token),
        ]
        feed = ns["WarehouseFeed"]()
        feed.on_leadership_acquired(lock)
        assert feed.subscription.stop is lock.signal
        feed.on_leadership_lost(lock, "released")
        assert feed.subscription.closed


def check_metrics_page(ns: dict[str, Any]) -> None:
    import os
    import tempfile

    response = ns["metrics"](RequestFactory().get("/metrics"))  # the default registry
    assert response.status_code == 200 and b"# TYPE django_locks_held gauge" in response.content
    with tempfile.TemporaryDirectory() as directory:
        with mock.patch.dict(os.environ, {"PROMETHEUS_MULTIPROC_DIR": directory}):
            response = ns["metrics"](RequestFactory().get("/metrics"))  # the directory's files
            assert response.status_code == 200 and b"django_locks_" not in response.content
            dead = Path(directory) / "gauge_livesum_4242.db"
            dead.touch()
            ns["child_exit"](None, types.SimpleNamespace(pid=4242))
            assert not dead.exists()


def check_conflicts_page(ns: dict[str, Any]) -> None:
    from django_locks import LockNotAcquiredError, locks

    assert ns["export_invoices"]() == 42
    assert ns["rebuild_search_index"](["a", "b"]) == 2
    with locks.lock("invoices:export"), pytest.raises(LockNotAcquiredError):
        ns["export_invoices"]()
    with locks.lock("crm"):  # the run lock the two CRM jobs share
        assert ns["crm_import"]() is None
        with pytest.raises(LockNotAcquiredError):
            ns["crm_export"]()


def check_operations_page(ns: dict[str, Any]) -> None:
    from django.contrib.auth.models import Group

    codenames = set(Group.objects.get(name="Operators").permissions.values_list("codename"))
    assert codenames == {("view_lease",), ("release_lease",)}


def setup_operations_page() -> None:
    from django.contrib.auth.models import Group

    Group.objects.create(name="Operators")


def leader_namespace() -> dict[str, Any]:
    recorded: list[tuple[str, int]] = []

    def record(event: str, *, fencing_token: int) -> None:
        recorded.append((event, fencing_token))

    return {"warehouse_client": WarehouseClient(), "record": record, "recorded": recorded}


CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "topics/locks.rst": check_locks_page,
    "topics/fencing.rst": check_fencing_page,
    "topics/leader-election.rst": check_leader_page,
    "howto/operations.rst": check_operations_page,
    "topics/metrics.rst": check_metrics_page,
    "topics/conflicts.rst": check_conflicts_page,
}
NAMESPACES: dict[str, Callable[[], dict[str, Any]]] = {
    "topics/leader-election.rst": leader_namespace,
}
SETUPS: dict[str, Callable[[], None]] = {"howto/operations.rst": setup_operations_page}
SIGNALS = [signals.lock_lost, signals.leadership_acquired, signals.leadership_lost]


@contextlib.contextmanager
def page_context() -> Iterator[None]:
    """Restore what running a page changes: registries, receivers, modules, leases."""
    receivers = {signal: list(signal.receivers) for signal in [*SIGNALS, signals.run_skipped]}
    modules = set(sys.modules)
    with (
        isolate_apps("tests.testapp"),
        mock.patch.dict(registry._claims),
        mock.patch.dict(leader._elections),
    ):
        try:
            yield
        finally:
            for signal, saved in receivers.items():
                with signal.lock:
                    signal.receivers = saved
                    signal.sender_receivers_cache.clear()
            for name in set(sys.modules) - modules:
                if name.split(".")[0] in {"myproject", "inventory"}:
                    del sys.modules[name]
            reset_locks()


def run_block(block: Block, ns: dict[str, Any]) -> None:
    before = set(ns)
    code = compile(block.code, f"{DOCS / block.page}:{block.line}", "exec")
    name = block.module
    if name is not None:
        for depth in range(1, name.count(".") + 1):
            parent = ".".join(name.split(".")[:depth])
            sys.modules.setdefault(parent, types.ModuleType(parent)).__path__ = []
        module = types.ModuleType(name)
        module.__dict__.update({k: v for k, v in ns.items() if not k.startswith("__")})
        sys.modules[name] = module
        exec(code, module.__dict__)
        ns.update({k: v for k, v in module.__dict__.items() if not k.startswith("__")})
    else:
        exec(code, ns)
    if "LOCKS" in ns and re.search(r"^LOCKS\b", block.code, re.MULTILINE):
        conf.read(ns["LOCKS"])  # what Django's startup validates
    for key in sorted(set(ns) - before):
        function = ns[key]
        if key.startswith("test_") and inspect.isfunction(function):
            if inspect.signature(function).parameters:
                continue
            if inspect.iscoroutinefunction(function):
                asyncio.run(function())
            else:
                function()


# Pages with something to run: those without a Python sample are not collected at all (rather
# than skipped), and a page gaining one is collected at once.
SAMPLED = [
    page
    for page in PAGES
    if page != TUTORIAL and (page in CHECKS or any(b.skip is None for b in blocks(page)))
]


@pytest.mark.django_db
@pytest.mark.parametrize("page", SAMPLED)
def test_page_samples_run(page: str) -> None:
    runnable = [block for block in blocks(page) if block.skip is None]
    ns: dict[str, Any] = {"__name__": "tests.testapp.docs_samples"}
    ns.update(NAMESPACES.get(page, dict)())
    with page_context():
        if page in SETUPS:
            SETUPS[page]()
        for block in runnable:
            registry._claims.clear()
            leader._elections.clear()
            run_block(block, ns)
        if page in CHECKS:
            CHECKS[page](ns)


def test_skipped_samples_are_few_and_say_why() -> None:
    skipped = [block for page in PAGES for block in blocks(page) if block.skip is not None]
    assert len(skipped) <= MAX_SKIPPED, [f"{b.page}:{b.line}" for b in skipped]
    assert all(len(block.skip or "") > 10 for block in skipped)


def test_every_page_with_samples_is_found() -> None:
    assert {"topics/locks.rst", "howto/custom-store.rst", "tutorial.rst"} <= set(PAGES)
    assert sum(len(blocks(page)) for page in PAGES) > 40


def custom_store_contract() -> type[LockStoreContract]:
    """The contract class of the custom-store how-to, defined by running the page."""
    ns: dict[str, Any] = {"__name__": "tests.testapp.docs_samples"}
    page = [block for block in blocks("howto/custom-store.rst") if block.skip is None]
    with mock.patch.dict(registry._claims), mock.patch.dict(leader._elections):
        run_block(next(block for block in page if block.module), ns)
        run_block(next(block for block in page if "LockStoreContract" in block.code), ns)
    contract: type[LockStoreContract] = ns["SQLiteFileStoreContract"]
    return contract


class TestCustomStoreContract(custom_store_contract()):  # type: ignore[misc]
    """The how-to's SQLite file store passes the contract, as the how-to says."""

    pytestmark = [pytest.mark.slow]
