"""The test suite's layout: every store contract class in tests/stores/test_contract.py.

"Every store we ship passes the contract" is then one file to read (tests/README.md). The scan is
of the source (AST), so a module pytest would skip or fail to import is read all the same.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest

import django_locks.stores
from django_locks.stores.base import LockStore
from django_locks.testing import capabilities, contract, harness

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
CONTRACT_FILE = "tests/stores/test_contract.py"

# The classes a contract subclass names as a base: LockStoreContract and each case mixin of
# django_locks.testing (OptionalCapabilityCases, ContractHarness, and any added later).
CONTRACT_CLASSES = frozenset(
    name
    for module in (contract, capabilities, harness)
    for name, value in vars(module).items()
    if inspect.isclass(value) and issubclass(value, harness.ContractHarness)
)

EXCEPTIONS = {
    ("tests/test_docs_samples.py", "TestCustomStoreContract"): (
        "the custom-store how-to's sample store, not one we ship: the class is made by running"
        " the page's code, so it is tested with the page's other samples"
    ),
    ("tests/stores/contract_for_django_runner.py", "InMemoryStoreContractUnderDjangoRunner"): (
        "shows the contract under Django's own test runner (tests/test_django_runner.py runs it);"
        " pytest does not collect it"
    ),
}


def _named(node: ast.expr) -> str | None:
    """The last name of ``Name`` or ``a.b.Name``; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def contract_classes(root: Path) -> Iterator[tuple[str, str]]:
    """(path relative to ``root``'s parent, class name) of each contract class under ``root``.

    A class is one when a base names a contract class (imported under any alias), a class found
    here already (a subclass of a subclass, in any module), or is a call to a function of its
    module whose return annotation names one (``class T(make_contract()):``).
    """
    trees = {
        path.relative_to(root.parent).as_posix(): ast.parse(path.read_text(), str(path))
        for path in sorted(root.rglob("*.py"))
        if "__pycache__" not in path.parts
    }
    known = set(CONTRACT_CLASSES)
    found: dict[tuple[str, str], None] = {}
    while True:
        before = len(found)
        for name, tree in trees.items():
            aliases = {
                alias.asname or alias.name
                for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom)
                for alias in node.names
                if alias.name in known
            }
            makers = {
                node.name
                for node in ast.walk(tree)
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                and node.returns is not None
                and any(
                    _named(n) in known for n in ast.walk(node.returns) if isinstance(n, ast.expr)
                )
            }
            for node in ast.walk(tree):
                if not isinstance(node, ast.ClassDef):
                    continue
                for base in node.bases:
                    called = _named(base.func) if isinstance(base, ast.Call) else None
                    if _named(base) in known | aliases or called in makers:
                        found[name, node.name] = None
                        known.add(node.name)
        if len(found) == before:
            return iter(found)


def test_no_contract_class_outside_the_contract_file() -> None:
    stray = [
        f"{path}: class {name}"
        for path, name in contract_classes(TESTS)
        if path != CONTRACT_FILE and (path, name) not in EXCEPTIONS
    ]
    assert stray == [], (
        "LockStoreContract subclasses belong in tests/stores/test_contract.py (a store's own"
        f" tests in its module beside it, see tests/README.md): {stray}"
    )


def test_each_exception_still_exists() -> None:
    # A stale exception would let a new class of that name through unseen.
    assert set(EXCEPTIONS) <= set(contract_classes(TESTS))


def test_every_store_we_ship_has_a_contract_class() -> None:
    shipped = {
        name
        for name in django_locks.stores.__all__
        if (value := getattr(django_locks.stores, name)) is not LockStore
        and inspect.isclass(value)
        and issubclass(value, LockStore)
    }
    tree = ast.parse((ROOT / CONTRACT_FILE).read_text())
    made = {
        _named(node.func)
        for cls in tree.body
        if isinstance(cls, ast.ClassDef)
        for method in cls.body
        if isinstance(method, ast.FunctionDef) and method.name == "make_store"
        for node in ast.walk(method)
        if isinstance(node, ast.Call)
    }
    assert shipped == {"DatabaseStore", "EtcdStore", "InMemoryStore", "RedisStore"}
    assert shipped <= made, shipped - made


@pytest.mark.parametrize(
    "source",
    [
        "from django_locks.testing import LockStoreContract\n"
        "class Stray(LockStoreContract): pass\n",
        "from django_locks.testing import LockStoreContract as Base\nclass Stray(Base): pass\n",
        "import django_locks.testing as t\nclass Stray(t.LockStoreContract): pass\n",
        "from django_locks.testing.capabilities import OptionalCapabilityCases\n"
        "class Stray(OptionalCapabilityCases): pass\n",
        "from tests.stores.test_contract import SQLiteContract\n"
        "class Stray(SQLiteContract): pass\n",
        "from django_locks.testing import LockStoreContract\n"
        "def make() -> type[LockStoreContract]: ...\nclass Stray(make()): pass\n",
    ],
    ids=["named", "aliased", "attribute", "mixin", "subclass-of-ours", "made-by-a-function"],
)
def test_the_scan_finds_a_stray_contract_class(tmp_path: Path, source: str) -> None:
    stores = tmp_path / "tests" / "stores"
    stores.mkdir(parents=True)
    (stores / "test_contract.py").write_text(
        "from django_locks.testing import LockStoreContract\n"
        "class SQLiteContract(LockStoreContract): pass\n"
    )
    (tmp_path / "tests" / "test_elsewhere.py").write_text(source)
    found = set(contract_classes(tmp_path / "tests"))
    assert ("tests/test_elsewhere.py", "Stray") in found
    assert ("tests/stores/test_contract.py", "SQLiteContract") in found


def test_the_scan_leaves_other_classes_alone(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_other.py").write_text(
        "from django.test import TestCase\nfrom django_locks.testing import ManualClock\n"
        "class Plain(TestCase): pass\nclass Clock(ManualClock): pass\n"
    )
    assert list(contract_classes(tmp_path / "tests")) == []
