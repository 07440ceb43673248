"""The library's layout: no module over 450 lines, no module-level import cycle.

Migrations are left out of the length rule (a released migration is frozen history: it cannot be
split by concept without changing the migration graph every project has applied) but kept in the
cycle rule, since Django's loader imports them like any other module.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import textwrap
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "django_locks"
MAX_LINES = 450


@dataclasses.dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool


def modules(root: Path) -> dict[str, Module]:
    """Every module of the package at ``root``, by dotted name (``pkg.sub`` for ``pkg/sub/``)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        name = ".".join(parts)
        found[name] = Module(name, path, is_package)
    return found


def long_modules(root: Path, limit: int = MAX_LINES) -> list[tuple[str, int]]:
    """``(path, lines)`` of every module over ``limit`` lines, migrations excepted."""
    long = []
    for module in modules(root).values():
        if "migrations" in module.path.relative_to(root).parts[:-1]:
            continue
        lines = len(module.path.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            long.append((str(module.path.relative_to(root.parent)), lines))
    return long


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_time_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of ``body`` that run when the module is imported: at the top level,
    in top-level ``if``/``try``/``with``/loops and class bodies; not in functions, not under
    ``if TYPE_CHECKING:`` (its ``else`` does run)."""
    for stmt in body:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            yield stmt
        elif isinstance(stmt, ast.If):
            if not _is_type_checking(stmt.test):
                yield from import_time_imports(stmt.body)
            yield from import_time_imports(stmt.orelse)
        elif isinstance(stmt, ast.Try | ast.TryStar):
            yield from import_time_imports(stmt.body)
            for handler in stmt.handlers:
                yield from import_time_imports(handler.body)
            yield from import_time_imports(stmt.orelse)
            yield from import_time_imports(stmt.finalbody)
        elif isinstance(stmt, ast.With | ast.For | ast.While):
            yield from import_time_imports(stmt.body)
            yield from import_time_imports(getattr(stmt, "orelse", []))
        elif isinstance(stmt, ast.ClassDef):
            yield from import_time_imports(stmt.body)


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def imported_by(module: Module, known: dict[str, Module]) -> dict[str, int]:
    """The modules of ``known`` that importing ``module`` imports directly, with the line of the
    first statement importing each.

    Importing ``a.b.c`` runs ``a`` and ``a.b`` first; those of them that are ``module`` itself or
    its own packages are left out: Python put them in ``sys.modules`` before ``module``'s first
    line ran, so importing them again runs nothing (unless a name defined there is read:
    ``from pkg import name`` where ``name`` is not a submodule keeps the edge to ``pkg``).
    """
    tree = ast.parse(module.path.read_text(encoding="utf-8"), str(module.path))
    own = set(_with_parents(module.name))
    edges: dict[str, int] = {}

    def add(name: str, line: int, *, reads_attribute: bool = False) -> None:
        if name in known and (reads_attribute or name not in own):
            edges.setdefault(name, line)

    for stmt in import_time_imports(tree.body):
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                for name in _with_parents(alias.name):
                    add(name, stmt.lineno)
            continue
        if stmt.level:
            package = module.name if module.is_package else module.name.rpartition(".")[0]
            for _ in range(stmt.level - 1):
                package = package.rpartition(".")[0]
            base = f"{package}.{stmt.module}" if stmt.module else package
        else:
            assert stmt.module is not None
            base = stmt.module
        for name in _with_parents(base)[:-1]:
            add(name, stmt.lineno)
        submodules = [f"{base}.{a.name}" for a in stmt.names if f"{base}.{a.name}" in known]
        add(base, stmt.lineno, reads_attribute=len(submodules) < len(stmt.names))
        for name in submodules:
            add(name, stmt.lineno)
    return edges


def import_cycles(root: Path) -> list[str]:
    """Each module-level import cycle among the modules under ``root``, as a path
    ``a (line 3) -> b (line 9) -> a``: one per strongly connected group of modules."""
    known = modules(root)
    graph = {name: imported_by(module, known) for name, module in known.items()}
    cycles = []
    for group in _strongly_connected(graph):
        if len(group) > 1:
            cycles.append(_cycle_through(min(group), graph, group))
    return sorted(cycles)


def _strongly_connected(graph: dict[str, dict[str, int]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative (a deep import chain must not hit the recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                groups.append(group)
    return groups


def _cycle_through(start: str, graph: dict[str, dict[str, int]], group: set[str]) -> str:
    """The shortest import path from ``start`` back to itself inside ``group``."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node]):
                if child not in group or child in came_from:
                    continue
                came_from[child] = node
                if child == start:
                    path = [start]
                    while path[-1] != start or len(path) == 1:
                        path.append(came_from[path[-1]])
                    path.reverse()
                    steps = [f"{a} (line {graph[a][b]})" for a, b in itertools.pairwise(path)]
                    return " -> ".join([*steps, start])
                following.append(child)
        frontier = following
    raise AssertionError(f"{start} is in a cycle but no path leads back to it")


# The checker, on trees made to fail.


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root / "pkg"


def test_a_cycle_is_reported_as_a_path_with_lines(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": '"""A."""\nfrom pkg import b\n',
            "pkg/b.py": "try:\n    from .c import thing\nexcept ImportError:\n    pass\n",
            "pkg/c.py": "import pkg.a\nthing = 1\n",
        },
    )
    assert import_cycles(root) == ["pkg.a (line 2) -> pkg.b (line 2) -> pkg.c (line 1) -> pkg.a"]


def test_imports_that_do_not_run_at_import_time_make_no_cycle(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg import b\n",
            "pkg/b.py": """\
                from typing import TYPE_CHECKING
                import typing
                if TYPE_CHECKING:
                    from pkg import a
                if typing.TYPE_CHECKING:
                    import pkg.a
                def late():
                    from pkg import a
                class Thing:
                    def method(self):
                        import pkg.a
                """,
        },
    )
    assert import_cycles(root) == []


def test_the_else_of_type_checking_and_class_bodies_do_run(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg import b, c\n",
            "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    pass\n"
            "else:\n    from pkg.a import x\n",
            "pkg/c.py": "class C:\n    from pkg import a\n",
        },
    )
    assert import_cycles(root) == ["pkg.a (line 1) -> pkg.b (line 5) -> pkg.a"]


def test_importing_a_submodule_runs_its_package(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/user.py": "import pkg.sub.leaf\n",
            "pkg/sub/__init__.py": "from pkg.user import helper\n",
            "pkg/sub/leaf.py": "",
        },
    )
    assert import_cycles(root) == ["pkg.sub (line 1) -> pkg.user (line 1) -> pkg.sub"]


def test_a_package_importing_its_own_submodules_is_no_cycle(tmp_path: Path) -> None:
    # The usual package: __init__ re-exports, the submodules import each other by absolute or
    # relative paths; their package is already in sys.modules when they run.
    root = write_tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/sub/__init__.py": "from pkg.sub.store import Store\nfrom . import wire\n",
            "pkg/sub/store.py": "from pkg.sub import wire\nfrom .wire import call\n",
            "pkg/sub/wire.py": "import pkg.sub.dialect\ncall = 1\n",
            "pkg/sub/dialect.py": "",
        },
    )
    assert import_cycles(root) == []


def test_reading_a_name_from_the_package_being_imported_is_a_cycle(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/sub/__init__.py": "from pkg.sub.store import Store\nSETTING = 1\n",
            "pkg/sub/store.py": "from pkg.sub import SETTING\n",
        },
    )
    assert import_cycles(root) == ["pkg.sub (line 1) -> pkg.sub.store (line 1) -> pkg.sub"]


def test_a_module_over_the_limit_is_named_with_its_length(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/short.py": "x = 1\n" * MAX_LINES,
            "pkg/sub/long.py": "x = 1\n" * (MAX_LINES + 1),
            "pkg/migrations/0001_initial.py": "x = 1\n" * 1000,
        },
    )
    assert long_modules(root) == [("pkg/sub/long.py", MAX_LINES + 1)]


# The library itself.


def test_no_library_module_is_over_450_lines() -> None:
    long = long_modules(PACKAGE)
    report = "\n".join(f"  {path}: {lines} lines" for path, lines in long)
    assert not long, f"Modules over {MAX_LINES} lines (split them by concept):\n{report}"


def test_no_module_level_import_cycle() -> None:
    cycles = import_cycles(PACKAGE)
    assert not cycles, "Module-level import cycles:\n" + "\n".join(f"  {c}" for c in cycles)


def test_the_checker_sees_the_library() -> None:
    # A checker that parsed nothing would pass: it must see the modules and their imports.
    known = modules(PACKAGE)
    assert {"django_locks", "django_locks.service", "django_locks.stores.base"} <= set(known)
    assert "django_locks.exceptions" in imported_by(known["django_locks.lock"], known)
