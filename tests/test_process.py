"""Per-process state: one at-fork hook, its listing complete and documented, what a child gets."""

from __future__ import annotations

import ast
import collections
import importlib
import json
import logging
import os
import signal
import sys
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from django_locks import Locks, process
from django_locks.process import AFTER_FORK, ProcessLocal, Step
from tests.test_layout import PACKAGE, imported_by, modules

DOCS_PAGE = PACKAGE.parent / "docs" / "internals" / "process.rst"
ONLY_IN_PROCESS = ("register_at_fork", "getpid")


def uses(source: str, filename: str = "<source>") -> Iterator[tuple[str, int]]:
    """``(name, line)`` of each use of ``register_at_fork`` or ``getpid`` in ``source``: as a
    name, an attribute, an imported name or a string (``getattr(os, "getpid")``)."""
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Name):
            found = node.id
        elif isinstance(node, ast.Attribute):
            found = node.attr
        elif isinstance(node, ast.alias):
            found = node.name.rpartition(".")[2]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found = node.value
        else:
            continue
        if found in ONLY_IN_PROCESS:
            yield found, getattr(node, "lineno", 0)


def uses_outside_process(root: Path) -> list[str]:
    found = []
    for module in modules(root).values():
        if module.name == f"{root.name}.process":
            continue
        source = module.path.read_text(encoding="utf-8")
        for name, line in uses(source, str(module.path)):
            found.append(f"{module.path.relative_to(root.parent)}:{line}: {name}")
    return found


def test_register_at_fork_and_getpid_appear_in_process_py_only() -> None:
    assert uses_outside_process(PACKAGE) == []
    source = (PACKAGE / "process.py").read_text(encoding="utf-8")
    assert [name for name, _ in uses(source)].count("register_at_fork") == 1  # one hook


@pytest.mark.parametrize(
    "line",
    [
        "os.register_at_fork(after_in_child=f)",
        "from os import register_at_fork",
        "hook = getattr(os, 'register_at_fork')",
        "me = os.getpid()",
        "from os import getpid as me",
    ],
)
def test_the_scan_finds_a_hook_or_a_pid_anywhere_else(tmp_path: Path, line: str) -> None:
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "process.py").write_text("import os\nos.register_at_fork(after_in_child=print)\n")
    (root / "clock.py").write_text(f"import os\n\n\ndef f() -> None:\n    pass\n\n\n{line}\n")
    found = uses_outside_process(root)
    assert len(found) == 1 and found[0].startswith("pkg/clock.py:8: "), found


def test_every_listed_step_exists_once_and_takes_no_argument() -> None:
    assert len({(step.module, step.function) for step in AFTER_FORK}) == len(AFTER_FORK)
    for step in AFTER_FORK:
        function = getattr(importlib.import_module(step.module), step.function)
        assert callable(function), step
        code = function.__code__
        assert code.co_argcount == 0 and code.co_kwonlyargcount == 0, step
        assert step.state.strip(), step


def test_every_listed_module_registers_the_hook_before_it_has_state() -> None:
    # Importing a listed module must import process.py (at module level, directly or not): a
    # program importing only that module and forking gets the hook all the same.
    known = modules(PACKAGE)

    def reaches_process(name: str) -> bool:
        seen, todo = set(), [name]
        while todo:
            current = todo.pop()
            if current == "django_locks.process":
                return True
            if current in seen or current not in known:
                continue
            seen.add(current)
            todo.extend(imported_by(known[current], known))
        return False

    assert [step.module for step in AFTER_FORK if not reaches_process(step.module)] == []


def test_the_docs_page_names_every_step_in_order() -> None:
    page = DOCS_PAGE.read_text(encoding="utf-8")
    where = [page.find(f"``{step.module}.{step.function}``") for step in AFTER_FORK]
    assert -1 not in where, [s for s, at in zip(AFTER_FORK, where, strict=True) if at == -1]
    assert where == sorted(where)


def test_the_hook_runs_the_imported_steps_in_order_past_a_failing_one(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[str] = []

    def failing() -> None:
        ran.append("failing")
        raise RuntimeError("boom")

    fake = types.ModuleType("tests.fake_state")
    fake.first = lambda: ran.append("first")  # type: ignore[attr-defined]
    fake.failing = failing  # type: ignore[attr-defined]
    fake.last = lambda: ran.append("last")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tests.fake_state", fake)
    monkeypatch.setattr(
        process,
        "AFTER_FORK",
        (
            Step("tests.fake_state", "first", "-"),
            Step("tests.never_imported_state", "anything", "-"),
            Step("tests.fake_state", "failing", "-"),
            Step("tests.fake_state", "last", "-"),
        ),
    )
    with caplog.at_level(logging.ERROR, logger="django_locks"):
        process.after_fork_in_child()
    assert ran == ["first", "failing", "last"]
    assert "tests.fake_state.failing() failed in a forked child" in caplog.text
    assert "tests.never_imported_state" not in sys.modules


def test_holder_is_host_and_pid() -> None:
    assert process.holder() == f"{os.uname().nodename}:{process.pid()}"
    from django_locks.stores.base import holder_name

    assert holder_name() == process.holder()


def _in_child(check: Callable[[], dict[str, object]]) -> dict[str, object]:
    """``check()`` run in a forked child (killed after 10 s: a lock inherited held hangs it)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            signal.alarm(10)
            os.write(write, json.dumps(check()).encode())
            os._exit(0)
        except BaseException:
            os._exit(2)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        out = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child failed or hung"
    result: dict[str, object] = json.loads(out)
    return result


def test_a_forked_child_starts_afresh_even_with_locks_held_by_the_parents_threads() -> None:
    from django_locks import aio, owners, ownership, renewal_batch
    from django_locks.clock import system_clock
    from django_locks.stores import InMemoryStore
    from django_locks.stores.redis import RedisStore

    inherited: list[object] = []
    made = ProcessLocal(lambda: object(), inherited=inherited.append)
    parents = made.get()
    redis = RedisStore(url="redis://127.0.0.1:1")  # built without I/O; never connects here
    notices: aio.ReleaseNotices[object] = aio.ReleaseNotices(InMemoryStore(), 0.1)
    notices._rooms["waited"] = collections.deque()
    locks = Locks(InMemoryStore(), ttl="30s")
    lock = locks.acquire("process:batched")
    assert lock is not None
    parent_owner = owners.new_owner()
    assert renewal_batch._last_batch is not None  # the lock joined a batch
    system_clock.notify(lambda: None)  # the background threads exist in the parent

    # Threads of the parent holding locks at fork() time: a child that kept those locks hangs.
    hold, holding = threading.Event(), threading.Barrier(2)
    held = [redis._waits_lock.get(), notices._mutex, ownership.sticky.mutex]
    ownership.sticky.keep("process:job", lock)

    def holder() -> None:
        for mutex in held:
            mutex.acquire()
        holding.wait()
        hold.wait()
        for mutex in held:
            mutex.release()

    thread = threading.Thread(target=holder)
    thread.start()
    holding.wait()

    def check() -> dict[str, object]:
        redis._waits_failing(OSError("down"))  # takes the waits lock
        with notices._mutex:
            rooms = dict(notices._rooms)
        sticky = list(ownership.sticky.by_key)
        ownership.sticky.keep("process:job", lock)  # takes the sticky leases' mutex
        ran = threading.Event()
        system_clock.notify(ran.set)  # a fresh notice thread runs it
        return {
            "fresh": made.get() is not parents,
            "inherited": inherited == [parents],
            "rooms": list(rooms),
            "owner": owners.new_owner()[:16] != parent_owner[:16],
            "batch": renewal_batch._last_batch is None,
            "notified": ran.wait(5),
            "lock held": lock.held,
            "sticky": sticky,
        }

    try:
        assert _in_child(check) == {
            "fresh": True,
            "inherited": True,
            "rooms": [],
            "owner": True,
            "batch": True,
            "notified": True,
            "lock held": False,
            "sticky": [],
        }
    finally:
        hold.set()
        thread.join()
    assert made.get() is parents and inherited == [] and list(notices._rooms) == ["waited"]
    assert ownership.sticky.held("process:batched") is lock
    ownership.sticky.by_key.clear()
    assert lock.held and lock.release()
