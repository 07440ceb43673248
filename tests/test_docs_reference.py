"""Every public name of SPEC section 2 has a reference entry in the built docs (their objects.inv).

The docs are built as CI builds them (``sphinx-build -W``), and the names are read from the code:
the package's ``__all__``, the stores' and the testing aids' ``__all__``, every signal, every
``LocksError``, the fenced writes, and the public members of the classes SPEC section 2 lists
method by method (the service, ``Lock``, ``AbortSignal``, ``ManualClock``, ``LockStore`` and the
stores shipped: every store capability). A name is documented when the inventory has it under
any path it is importable from (``django_locks.Lock`` or ``django_locks.lock.Lock``); a member
also counts when documented on a base class (``ManualClock.sleep`` on ``Clock``).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from django.dispatch import Signal

import django_locks
from django_locks import exceptions, fencing, signals, stores, testing
from django_locks.testing import pytest_plugin

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

# It builds the docs with Sphinx (a development requirement, as for `make docs`): a slow test, run
# by `make test` and CI's whole suite, not by tox's fast envs, which install no Sphinx.
pytestmark = pytest.mark.slow

# The classes whose public members SPEC section 2 names one by one.
MEMBERS_OF = ["Locks", "Lock", "AbortSignal", "ManualClock", *stores.__all__]
FIXTURES = ["locks_reset"]  # pytest fixtures of django_locks.testing (SPEC section 7)
# LOCKS["METRICS"]'s exporters, with their extras.
EXPORTER_MODULES = ["django_locks.contrib.opentelemetry", "django_locks.contrib.prometheus"]
# Celery's uniqueness at enqueue time (SPEC section 14), importable from contrib.celery.
CELERY_UNIQUE = ["unique", "UniqueTask", "HEADER_UNIQUE"]
# django.tasks' uniqueness at enqueue time (SPEC section 14), importable from contrib.tasks.
TASKS_UNIQUE = ["unique_task", "enqueue_unique", "try_enqueue_unique"]


@dataclasses.dataclass(frozen=True)
class Public:
    """One public name, and the inventory names any one of which documents it."""

    name: str
    paths: frozenset[str]


def build_inventory(out: Path) -> set[str]:
    """Build the docs with ``-W`` into ``out``; the Python objects of its ``objects.inv``."""
    env = {k: v for k, v in os.environ.items() if k != "DOCS_INTERSPHINX"}
    command = [sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", str(DOCS), str(out)]
    built = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, f"sphinx-build -W failed:\n{built.stdout}\n{built.stderr}"
    return read_inventory(out / "objects.inv")


def read_inventory(path: Path) -> set[str]:
    """The ``py:`` names of a Sphinx inventory (version 2: four header lines, then zlib)."""
    data = path.read_bytes()
    header = data.split(b"\n", 4)
    assert header[0] == b"# Sphinx inventory version 2", header[0]
    names = set()
    for line in zlib.decompress(header[4]).decode("utf-8").splitlines():
        name, role = line.split(" ", 2)[:2]
        if role.startswith("py:"):
            names.add(name)
    return names


def paths_of(obj: object, *modules: str) -> set[str]:
    """Where ``obj`` can be documented: each module exporting it, and where it is defined."""
    name = getattr(obj, "__name__", None)
    found = {f"{module}.{name}" for module in modules} if name else set()
    if inspect.isclass(obj) or inspect.isfunction(obj):
        found.add(f"{obj.__module__}.{obj.__qualname__}")
    return found


def exported(module: str, name: str, home: str | None = None) -> Public:
    obj = getattr(importlib.import_module(module), name)
    paths = {f"{module}.{name}", *paths_of(obj)}
    if home is not None:
        paths.add(f"{home}.{name}")
    return Public(f"{module}.{name}", frozenset(paths))


def public_names() -> list[Public]:
    """Every public name of SPEC section 2 that the code has, read from the code."""
    found = [
        exported("django_locks", name, django_locks._LAZY[name]) for name in django_locks.__all__
    ]
    found += [
        exported("django_locks.stores", name, stores._LAZY.get(name)) for name in stores.__all__
    ]
    found += [exported("django_locks.testing", name) for name in testing.__all__]
    for name in FIXTURES:
        assert hasattr(pytest_plugin, name), name
        path = f"{pytest_plugin.__name__}.{name}"
        found.append(Public(path, frozenset({path})))
    for name, value in vars(signals).items():
        if isinstance(value, Signal):
            found.append(
                Public(f"django_locks.signals.{name}", frozenset({f"{signals.__name__}.{name}"}))
            )
    for name, value in vars(exceptions).items():
        if inspect.isclass(value) and issubclass(value, exceptions.LocksError):
            found.append(exported(exceptions.__name__, name))
    for name, value in vars(fencing).items():
        if not name.startswith("_") and getattr(value, "__module__", None) == fencing.__name__:
            found.append(exported(fencing.__name__, name))
    for module in EXPORTER_MODULES:  # SPEC section 11: each exporter's __all__
        found += [exported(module, name) for name in importlib.import_module(module).__all__]
    found += [
        exported("django_locks.contrib.celery", name, "django_locks.contrib.celery_unique")
        for name in CELERY_UNIQUE
    ]
    found += [exported("django_locks.contrib.tasks", name) for name in TASKS_UNIQUE]
    for public in list(found):
        short = public.name.rsplit(".", 1)[1]
        obj = getattr(importlib.import_module(public.name.rsplit(".", 1)[0]), short)
        if short in MEMBERS_OF and inspect.isclass(obj):  # (not a constant such as PERMITS_OWNER)
            found += members(public, obj)
    return found


def members(owner: Public, cls: type) -> list[Public]:
    """The public members ``cls`` defines, each documented on ``cls`` or on a base defining it."""
    found = []
    for member in vars(cls):
        if member.startswith("_"):
            continue
        paths = {f"{path}.{member}" for path in owner.paths}
        for base in cls.__mro__[1:-1]:
            paths |= {f"{path}.{member}" for path in paths_of(base)}
        found.append(Public(f"{owner.name}.{member}", frozenset(paths)))
    return found


def missing(inventory: set[str], names: list[Public]) -> list[str]:
    return sorted(public.name for public in names if not public.paths & inventory)


@pytest.fixture(scope="module")
def inventory(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    return build_inventory(tmp_path_factory.mktemp("docs"))


def test_every_public_name_has_a_reference_entry(inventory: set[str]) -> None:
    gone = missing(inventory, public_names())
    assert not gone, "no reference entry in docs/ref/ for: " + ", ".join(gone)


def test_the_names_include_what_spec_section_2_lists() -> None:
    names = {public.name for public in public_names()}
    for name in [
        "django_locks.on_one_instance",
        "django_locks.without_overlapping",
        "django_locks.leader_election",
        "django_locks.stores.LockStore.renew_many",
        "django_locks.stores.LockStore.warp",
        "django_locks.stores.LockStore.wait_for_release",
        "django_locks.stores.InMemoryStore.takes_clock",
        "django_locks.stores.RedisStore",
        "django_locks.Lock.leave_for",
        "django_locks.signals.run_skipped",
        "django_locks.exceptions.OwnTransactionError",
        "django_locks.fencing.fenced_update",
        "django_locks.testing.pytest_plugin.locks_reset",
    ]:
        assert name in names, name


def test_a_name_without_its_entry_is_reported(inventory: set[str]) -> None:
    # The check tried on inventories made to fail: each public name with its entries taken out.
    names = public_names()
    for public in names:
        assert public.name in missing(inventory - public.paths, names), public.name
