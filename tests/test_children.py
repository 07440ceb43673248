"""The child-process rules of tests/README.md, as scans: Python a child runs is a module (no code
in a string for ``python -c``), and its settings come from DJANGO_LOCKS_TEST_* through
tests/children/env.py (no other variable spelled out elsewhere)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.children.env import PREFIX, VARIABLES, child_env, read

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
SCANNED = ("tests", "benchmarks", "testproject")
# The one short -c left (tests/README.md): longer than this is a module of tests/children/.
ONE_LINER = 80
# An old convention's prefix, or a variable of the new one spelled out (not a read() name).
OTHER_CONVENTION = re.compile(r"^(DL_|FAULTS_DATABASES$|DJANGO_LOCKS_TEST_|DJANGO_LOCKS_EXPECT)")


def _python(node: ast.expr) -> bool:
    """Whether ``node`` names Python: ``sys.executable`` or a path ending in ``python``."""
    if isinstance(node, ast.Attribute) and node.attr == "executable":
        return True
    text = ast.unparse(node)
    return text.rstrip("'\")").endswith("python")


def python_c_code(root: Path) -> list[str]:
    """``[python, "-c", code]`` lists whose code is not a short string constant."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.List | ast.Tuple) or not node.elts:
                continue
            elts = node.elts
            if not _python(elts[0]):
                continue
            for i, elt in enumerate(elts[:-1]):
                if isinstance(elt, ast.Constant) and elt.value == "-c":
                    code = elts[i + 1]
                    short = isinstance(code, ast.Constant) and len(str(code.value)) <= ONE_LINER
                    if not short:
                        found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def spelled_out_variables(root: Path, allowed: set[Path]) -> list[str]:
    """String constants naming a child's variable (or an old convention's) outside ``allowed``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path in allowed:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            if OTHER_CONVENTION.match(node.value):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {node.value}")
    return found


def test_no_child_process_code_in_a_string_for_python_c() -> None:
    found = [hit for name in SCANNED for hit in python_c_code(ROOT / name)]
    assert found == [], "make these modules of tests/children/ (tests/README.md)"


def test_child_settings_are_named_only_in_tests_children_env() -> None:
    allowed = {TESTS / "children" / "env.py", Path(__file__).resolve()}
    found = [hit for name in SCANNED for hit in spelled_out_variables(ROOT / name, allowed)]
    assert found == [], "use child_env() and read() of tests/children/env.py (tests/README.md)"


def test_the_scans_find_what_they_look_for(tmp_path: Path) -> None:
    (tmp_path / "child.py").write_text(
        "import os, subprocess, sys\n"
        "subprocess.run([sys.executable, '-c', 'import django; django.setup(); print(1); '\n"
        "                '# and much more code than a one-liner, far more'])\n"
        "subprocess.run([sys.executable, '-c', CODE])\n"
        "subprocess.run([bin_dir / 'python', '-c', 'import django_locks'])\n"
        "subprocess.run(['celery', 'worker', '-c', str(2)])\n"
        "os.environ.get('DL_DB'), os.environ['DJANGO_LOCKS_TEST_LOCKS'], read('LOCKS')\n",
        encoding="utf-8",
    )
    assert python_c_code(tmp_path) == ["child.py:2", "child.py:4"]
    assert [hit.split(": ")[1] for hit in spelled_out_variables(tmp_path, set())] == [
        "DL_DB",
        "DJANGO_LOCKS_TEST_LOCKS",
    ]


def test_child_env_gives_a_child_only_what_it_is_given_and_read_undoes_it(monkeypatch) -> None:
    monkeypatch.setenv(PREFIX + "LOCKS", '{"inherited": true}')
    env = child_env(
        base={PREFIX + "BROKER": "inherited", "PATH": "/bin"},
        settings="tests.settings",
        postgres={"NAME": "x"},
        beat_app=True,
        runs=Path("/tmp/runs"),
    )
    assert env == {
        "PATH": "/bin",
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        PREFIX + "POSTGRES": '{"NAME": "x"}',
        PREFIX + "BEAT_APP": "1",
        PREFIX + "RUNS": "/tmp/runs",
    }
    assert PREFIX + "LOCKS" not in child_env()
    assert read("LOCKS") == '{"inherited": true}'
    assert set(VARIABLES) >= {"POSTGRES", "LOCKS", "RUNS"}
    try:
        read("LOCK")
    except ValueError as exc:
        assert "'LOCK'" in str(exc)
    else:
        raise AssertionError("an unknown variable name must be refused")
