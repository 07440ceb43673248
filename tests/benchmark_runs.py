"""Running ``python -m benchmarks ... --quick`` from a test (tests/test_benchmarks*.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.servers import missing

ROOT = Path(__file__).resolve().parent.parent


def quick_benchmark(
    *flags: str, figures: Path, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """Run the benchmark command with ``flags`` (``"--etcd"``; none: the main run), ``--quick``,
    its figures written to ``figures``; a server it cannot start is ``missing`` (a failure under
    CI=true), any other failure fails the test with the command's output."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks", *flags, "--quick", "--json", str(figures)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if run.returncode == 2 and "Cannot run" in run.stdout:
        missing(run.stdout.strip().splitlines()[-1])
    assert run.returncode == 0, run.stdout + run.stderr
    return run
