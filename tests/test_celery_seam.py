"""The Celery seam: importing it changes nothing, Celery's private API in one module, and the
decorators above ``@shared_task`` still working (with a ``DeprecationWarning`` naming the fix)."""

# mypy: disable-error-code="untyped-decorator"

from __future__ import annotations

import ast
import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, current_app, shared_task

from django_locks import current_lock, without_overlapping
from django_locks.contrib import celery as seam

PACKAGE = Path(__file__).resolve().parent.parent / "django_locks"
COMPAT = PACKAGE / "contrib" / "celery_compat.py"

# Run in a fresh interpreter (tests/children/celery_seam_probe.py): what importing the seam
# connects, sets or registers; then what install() connects (the same probe, so that the first half
# can fail); then a task run without install(): its run lock is named after the task (the seam is
# asked, not hooked in).


def probe() -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.children.celery_seam_probe"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=PACKAGE.parent,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PACKAGE.parent)},
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_importing_the_seam_connects_and_sets_nothing_until_installed() -> None:
    found = probe()
    assert found["imported"] == found["before"], "importing django_locks.contrib.celery"
    assert found["hook"] is False, "a task-name hook set at import"
    connected = {
        name: count - found["before"]["signals"][name]
        for name, count in found["installed"]["signals"].items()
        if count != found["before"]["signals"][name]
    }
    assert connected == {"beat_init": 1, "before_task_publish": 1, "task_prerun": 1}
    # Not installed, the seam still names the running task: the default key is its name.
    assert found["key"] == "probe.named"


def private_celery_imports(path: Path) -> list[str]:
    """``celery._...`` names imported by ``path`` (any submodule or name starting with ``_``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            names = [alias.name for alias in node.names]
            if parts[0] == "celery" and (
                any(p.startswith("_") for p in parts[1:]) or any(n.startswith("_") for n in names)
            ):
                found.append(f"{node.lineno}: from {node.module} import {', '.join(names)}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "celery" and any(p.startswith("_") for p in parts[1:]):
                    found.append(f"{node.lineno}: import {alias.name}")
    return found


def test_celery_private_api_is_imported_only_in_the_compat_block() -> None:
    elsewhere = {
        str(path.relative_to(PACKAGE)): found
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != COMPAT and (found := private_celery_imports(path))
    }
    assert elsewhere == {}, f"Celery's private API outside contrib/celery_compat.py: {elsewhere}"
    text = COMPAT.read_text(encoding="utf-8").splitlines()
    begin = next(i for i, line in enumerate(text) if "Celery private API: begin" in line)
    end = next(i for i, line in enumerate(text) if "Celery private API: end" in line)
    inside = [int(found.split(":")[0]) - 1 for found in private_celery_imports(COMPAT)]
    assert inside and all(begin < line < end for line in inside), (begin, end, inside)
    assert "5.4" in text[begin] and "5.7" in text[begin], "the versions checked"


def test_the_scan_finds_a_private_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("from celery._state import get_current_task\nimport celery._state\n")
    assert len(private_celery_imports(sample)) == 2


@pytest.mark.usefixtures("locks_reset")
def test_a_decorator_above_app_task_works_and_warns_with_the_fix() -> None:
    app = Celery("seam-above", set_as_current=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        @without_overlapping("seam:above")
        @app.task(name="seam.above")
        def above() -> str:
            lock = current_lock()
            assert lock is not None
            return lock.key

    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert len(deprecations) == 1, [str(w.message) for w in caught]
    assert "below the task decorator" in str(deprecations[0].message)
    assert deprecations[0].filename == __file__, "points at the decorator's line"
    app.finalize()
    assert app.tasks["seam.above"].apply().get() == "seam:above"


@pytest.mark.usefixtures("locks_reset")
def test_a_decorator_above_shared_task_works_once_the_app_is_finalized() -> None:
    with pytest.warns(DeprecationWarning, match="@shared_task first"):

        @without_overlapping("seam:shared")
        @shared_task(name="seam.shared")
        def shared() -> str:
            lock = current_lock()
            assert lock is not None
            return lock.key

    # The task a shared_task proxy stands for is the current app's (a project's one app).
    previous = current_app._get_current_object()
    app = Celery("seam-shared", set_as_current=True)
    try:
        app.finalize()
        assert app.tasks["seam.shared"].apply().get() == "seam:shared"
    finally:
        previous.set_current()


@pytest.mark.usefixtures("locks_reset")
def test_a_decorator_below_the_task_does_not_warn() -> None:
    app = Celery("seam-below", set_as_current=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)

        @app.task(name="seam.below")
        @without_overlapping()
        def below() -> str:
            lock = current_lock()
            assert lock is not None
            return lock.key

    app.finalize()
    assert app.tasks["seam.below"].apply().get() == "seam.below"
    assert seam.current_task_name(below.run) is None, "no task runs now"
