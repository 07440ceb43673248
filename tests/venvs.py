"""Wheels built from a source tree and fresh virtualenvs to install them in, as a user does."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tests.children.env import PREFIX

ROOT = Path(__file__).resolve().parent.parent

# What a copy of the checkout leaves out: local state, caches and earlier builds (the build must
# see the files a clean clone has, not this machine's leftovers).
IGNORED = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".tox",
    "*.egg-info",
    "build",
    "dist",
    "_build",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    "artifacts",
)

# Variables of this test session that must not leak into a user's project (and every
# DJANGO_LOCKS_TEST_* of tests/children/env.py).
PRIVATE_VARIABLES = (
    "PYTHONPATH",
    "PYTHONHOME",
    "VIRTUAL_ENV",
    "DJANGO_SETTINGS_MODULE",
    "PYTEST_ADDOPTS",
    "PYTEST_PLUGINS",
    "PYTEST_CURRENT_TEST",
)


def run(
    args: Sequence[str | os.PathLike[str]],
    *,
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``args`` with no standard input; on failure (``check``) raise with its output."""
    result = subprocess.run(
        [str(arg) for arg in args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, args))} exited {result.returncode}\n--- stdout ---\n"
            f"{result.stdout}\n--- stderr ---\n{result.stderr}"
        )
    return result


def copy_checkout(destination: Path) -> Path:
    """The checkout's files, without local state, in ``destination``."""
    shutil.copytree(ROOT, destination, ignore=IGNORED)
    return destination


def build_dists(source: Path, outdir: Path) -> tuple[Path, Path]:
    """``python -m build`` of ``source``: the sdist, then the wheel built from that sdist."""
    run([sys.executable, "-m", "build", "--outdir", outdir, source], cwd=source, timeout=600)
    sdists = sorted(outdir.glob("*.tar.gz"))
    wheels = sorted(outdir.glob("*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, sorted(outdir.iterdir())
    return sdists[0], wheels[0]


def make_venv(path: Path, requirements: Sequence[str | os.PathLike[str]]) -> Path:
    """A new virtualenv at ``path`` with ``requirements`` installed; its ``bin`` directory."""
    run([sys.executable, "-m", "venv", path], cwd=path.parent, env=user_env())
    bin_dir = path / "bin"
    run(
        [bin_dir / "python", "-m", "pip", "install", "-q", *requirements],
        cwd=path.parent,
        env=user_env(),
        timeout=600,
    )
    return bin_dir


def user_env(bin_dir: Path | None = None, **extra: str) -> dict[str, str]:
    """This process's environment without the test session's own variables, ``bin_dir`` first
    on ``PATH`` (as an activated virtualenv has it)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in PRIVATE_VARIABLES and not k.startswith(PREFIX)
    }
    paths = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != str(ROOT / ".venv/bin")]
    if bin_dir is not None:
        paths.insert(0, str(bin_dir))
    env["PATH"] = os.pathsep.join(paths)
    env.update(extra)
    return env
