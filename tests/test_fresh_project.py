"""The package as a newcomer meets it: the wheel (not the checkout) in a fresh virtualenv, a new
`startproject`, the app added, migrate, and the project's own tests run twice by `manage.py test`
and once by pytest-django with the documented autouse fixture, on PostgreSQL and on SQLite."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.venvs import ROOT, build_dists, copy_checkout, make_venv, run, user_env

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.timeout(900)]

PROJECT_FILES = Path(__file__).resolve().parent / "fresh_project"
TESTING_DOCS = ROOT / "docs" / "topics" / "testing.rst"

# Counted by the runs below: tests/fresh_project/shop/tests.py.
UNITTEST_TESTS = 6
PYTEST_TESTS = UNITTEST_TESTS + 4

# Nothing a project's test run should print: the warning of a lock released inside a real
# atomic() (TestCase's own transaction is not one), W101 under DEBUG = True, a test database
# left behind by the previous run, a teardown that could not drop it.
UNWANTED = (
    "released inside transaction.atomic()",
    "django_locks.W101",
    "already exists",
    "being accessed by other users",
    "Error when trying to teardown",
)


@dataclass
class Newcomer:
    bin: Path
    wheel: Path
    sdist: Path


@pytest.fixture(scope="module")
def newcomer(tmp_path_factory: pytest.TempPathFactory) -> Newcomer:
    """The sdist and wheel built from the checkout; a virtualenv with the wheel's `postgres`
    extra and pytest-django installed from the package index (shared by both databases)."""
    base = tmp_path_factory.mktemp("newcomer")
    source = copy_checkout(base / "source")
    sdist, wheel = build_dists(source, base / "dist")
    assert wheel.name.startswith("django_distributed_locks-"), wheel.name
    assert sdist.name.startswith("django_distributed_locks-"), sdist.name
    bin_dir = make_venv(base / "venv", [f"{wheel}[postgres]", "pytest-django"])
    # The installed package is the wheel's, not this checkout.
    where = run(
        [bin_dir / "python", "-c", "import django_locks; print(django_locks.__file__)"],
        cwd=base,
        env=user_env(bin_dir),
    ).stdout.strip()
    assert where.startswith(str(base / "venv")), where
    return Newcomer(bin=bin_dir, wheel=wheel, sdist=sdist)


def documented_autouse_fixture() -> str:
    """The conftest.py of the testing page, as it is written there."""
    text = TESTING_DOCS.read_text()
    intro = "To use it everywhere, make it autouse in your ``conftest.py``:"
    assert intro in text, f"{TESTING_DOCS} no longer says {intro!r}"
    block = text.split(intro, 1)[1].split(".. code-block:: python", 1)[1]
    lines = []
    for line in block.splitlines()[1:]:
        if line and not line.startswith("    "):
            break
        lines.append(line[4:])
    code = "\n".join(lines).strip() + "\n"
    assert "locks_reset" in code, code
    return code


def start_project(newcomer: Newcomer, where: Path, databases: dict[str, Any] | None) -> Path:
    """`django-admin startproject mysite`, the app added, the project's tests and conftest.py,
    and ``databases`` as its DATABASES (None: startproject's own SQLite file)."""
    run([newcomer.bin / "django-admin", "startproject", "mysite"], cwd=where, env=user_env())
    project = where / "mysite"
    settings = project / "mysite" / "settings.py"
    text = settings.read_text()
    text, added = re.subn(
        r"(INSTALLED_APPS = \[\n(?:    .*\n)*?)(\])",
        r'\1    "django_locks",\n    "shop",\n\2',
        text,
        count=1,
    )
    assert added == 1, text
    assert re.search(r"^DEBUG = True$", text, re.M), "startproject's settings say DEBUG = True"
    if databases is not None:
        text += f"\nDATABASES = {databases!r}\n"
    settings.write_text(text)
    shutil.copytree(PROJECT_FILES / "shop", project / "shop")
    shutil.copy(PROJECT_FILES / "pytest.ini", project / "pytest.ini")
    (project / "conftest.py").write_text(documented_autouse_fixture())
    return project


def check_output(result: Any) -> None:
    output = result.stdout + result.stderr
    for unwanted in UNWANTED:
        assert unwanted not in output, output


def run_the_projects_tests(newcomer: Newcomer, project: Path) -> None:
    """migrate; `manage.py test` twice; pytest once."""
    env = user_env(newcomer.bin)
    python = newcomer.bin / "python"
    run([python, "manage.py", "migrate", "-v", "0"], cwd=project, env=env)
    # Twice: the first run must leave no test database behind for the second. The first runs
    # with no standard input and no --noinput: a leftover database would ask, and fail.
    for extra in ([], ["--noinput"]):
        result = run([python, "manage.py", "test", "-v", "2", *extra], cwd=project, env=env)
        check_output(result)
        assert f"Ran {UNITTEST_TESTS} tests" in result.stderr, result.stderr
    result = run([python, "-m", "pytest", "-v"], cwd=project, env=env)
    check_output(result)
    assert f"{PYTEST_TESTS} passed" in result.stdout, result.stdout
    # The tests without database access on their own (pytest-django runs them last otherwise,
    # after the database tests have opened the store's connections): no test database exists,
    # the alias names the development database, and the autouse fixture must not touch it.
    result = run(
        [python, "-m", "pytest", "-v", "-k", "without_database or no_database"],
        cwd=project,
        env=env,
    )
    check_output(result)
    assert "2 passed" in result.stdout, result.stdout


def leftover_test_databases(server: Any) -> list[str]:
    conn = server.connect()
    try:
        cursor = conn.cursor()
        cursor.execute("SELECT datname FROM pg_database WHERE datname LIKE 'test_mysite%'")
        return sorted(row[0] for row in cursor.fetchall())
    finally:
        conn.close()


def test_a_new_project_on_postgresql(
    newcomer: Newcomer, postgres_server: Any, tmp_path: Path
) -> None:
    name = "mysite_fresh"
    conn = postgres_server.connect()
    try:
        for statement in (
            f"DROP DATABASE IF EXISTS test_{name}",
            f"DROP DATABASE IF EXISTS {name}",
            f"CREATE DATABASE {name}",
        ):
            conn.cursor().execute(statement)
    finally:
        conn.close()
    project = start_project(
        newcomer, tmp_path, {"default": postgres_server.database_settings(name)}
    )
    run_the_projects_tests(newcomer, project)
    assert leftover_test_databases(postgres_server) == []

    # Twice with --keepdb: the kept database starts the second run with no lease of the first
    # (LeftHeldTests takes its key again well within the first run's ttl).
    env = user_env(newcomer.bin)
    # Only that class: a TransactionTestCase would empty the table anyway (Django flushes the
    # database after each of its tests).
    for _ in range(2):
        result = run(
            [
                *(newcomer.bin / "python", "manage.py", "test", "--keepdb", "-v", "2"),
                "shop.tests.AbandonedLockTests",
            ],
            cwd=project,
            env=env,
        )
        assert "Ran 1 test" in result.stderr, result.stderr
        assert "Preserving test database" in result.stderr, result.stderr
        for unwanted in UNWANTED[:2]:
            assert unwanted not in result.stdout + result.stderr, result.stderr
    assert leftover_test_databases(postgres_server) == [f"test_{name}"]
    conn = postgres_server.connect()
    try:
        conn.cursor().execute(f"DROP DATABASE test_{name}")
    finally:
        conn.close()


def test_a_new_project_on_sqlite(newcomer: Newcomer, tmp_path: Path) -> None:
    project = start_project(newcomer, tmp_path, None)
    run_the_projects_tests(newcomer, project)
