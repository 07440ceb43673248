"""LockStoreContract runs under Django's test runner too, not only under pytest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_contract_suite_runs_under_djangos_test_runner() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "django",
            "test",
            "tests.stores.contract_for_django_runner",
            "--settings=tests.settings",
            "-v",
            "2",
            "--noinput",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    ours = [line for line in out.stderr.splitlines() if "UnderDjangoRunner." in line]
    assert len(ours) >= 20, out.stderr
    # Every case passes, but those for stores WITHOUT a capability, which skip on one that
    # offers it ("... skipped 'InMemoryStore offers preempt requests'").
    passed = [line for line in ours if line.endswith(" ... ok")]
    without = [line for line in ours if "skipped 'InMemoryStore offers " in line]
    assert len(passed) + len(without) == len(ours) and len(without) <= 3, out.stderr
    # The imported base class is found too, and skips itself (it has no store).
    assert "make_store() is not overridden" in out.stderr
    assert "test_exactly_one_of_many_concurrent_callers_wins" in out.stderr
