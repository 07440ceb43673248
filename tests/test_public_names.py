"""The package's public names: one table for Python, the same names for type checkers."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import django_locks

INIT = Path(django_locks.__file__)


def type_checking_imports() -> dict[str, str]:
    """``name -> module`` of the imports under ``if TYPE_CHECKING:`` in ``__init__.py``."""
    found: dict[str, str] = {}
    for stmt in ast.parse(INIT.read_text(encoding="utf-8")).body:
        if isinstance(stmt, ast.If) and getattr(stmt.test, "id", None) == "TYPE_CHECKING":
            for node in stmt.body:
                assert isinstance(node, ast.ImportFrom) and node.module, ast.dump(node)
                for alias in node.names:
                    assert alias.asname == alias.name, f"{alias.name} is not re-exported"
                    found[alias.name] = node.module
    return found


def test_type_checkers_see_the_names_python_does() -> None:
    assert type_checking_imports() == django_locks._LAZY
    assert django_locks.__all__ == sorted(django_locks._LAZY)
    assert dir(django_locks) == django_locks.__all__


def test_each_name_is_its_modules_object() -> None:
    for name, module in django_locks._LAZY.items():
        assert getattr(django_locks, name) is getattr(importlib.import_module(module), name)


def test_a_star_import_gives_the_public_names() -> None:
    namespace: dict[str, object] = {}
    exec("from django_locks import *", namespace)
    assert sorted(set(namespace) - {"__builtins__"}) == django_locks.__all__
