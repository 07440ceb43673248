"""The supervisor of ``run_leader --exec`` on its own (``python -m django_locks.supervise``), with a
real child recording its start, beats and stop: its timer alone ends the child (SIGTERM at the
deadline minus the grace, SIGKILL at the deadline), renewals move the deadline, a closed pipe or
a SIGTERM stops the child at once, a SIGKILLed supervisor takes the child with it
(PR_SET_PDEATHSIG), and the exit code is the child's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.children.exec_fleet import RECORDER, ROOT, Term, terms

pytestmark = pytest.mark.slow


class Supervised:
    def __init__(self, tmp: Path, mode: list[str], *, grace: float, deadline_in: float) -> None:
        self.records = tmp / "children.jsonl"
        read_end, self.pipe = os.pipe()
        self.began = time.monotonic()
        self.deadline = self.began + deadline_in
        args = [sys.executable, "-m", "django_locks.supervise", "--fd", str(read_end)]
        args += ["--grace", repr(grace), "--deadline", repr(self.deadline), "--"]
        args += [sys.executable, str(RECORDER), str(self.records), *mode]
        self.proc = subprocess.Popen(args, cwd=ROOT, pass_fds=(read_end,))
        os.close(read_end)

    def tell(self, line: str) -> None:
        os.write(self.pipe, line.encode() + b"\n")

    def child(self, timeout: float = 5.0) -> Term:
        give_up = time.monotonic() + timeout
        while not terms(self.records) and time.monotonic() < give_up:
            time.sleep(0.005)
        return terms(self.records)[0]

    def wait(self, timeout: float = 10.0) -> tuple[int, Term]:
        code = self.proc.wait(timeout)
        os.close(self.pipe)
        return code, terms(self.records)[0]


def test_the_deadline_ends_the_child_with_sigterm_at_deadline_minus_grace(tmp_path: Path) -> None:
    supervised = Supervised(tmp_path, ["run"], grace=0.3, deadline_in=1.0)
    code, child = supervised.wait()
    assert code == 0 and child.stopped
    assert supervised.deadline - 0.3 <= child.end < supervised.deadline - 0.2, child


def test_the_deadline_sigkills_a_child_that_ignores_sigterm(tmp_path: Path) -> None:
    supervised = Supervised(tmp_path, ["ignore-term"], grace=0.3, deadline_in=1.0)
    code, child = supervised.wait()
    assert code == 128 + signal.SIGKILL and not child.stopped
    assert supervised.deadline - 0.05 < child.end < supervised.deadline, child


def test_renewals_move_the_deadline(tmp_path: Path) -> None:
    supervised = Supervised(tmp_path, ["ignore-term"], grace=0.3, deadline_in=1.0)
    last = supervised.deadline
    for _ in range(6):  # 1.8 s past the first deadline
        time.sleep(0.3)
        last = time.monotonic() + 1.0
        supervised.tell(f"deadline {last!r}")
    code, child = supervised.wait()
    assert code == 128 + signal.SIGKILL
    assert last - 0.05 < child.end < last, (child, last)


def test_a_closed_pipe_stops_the_child_at_once(tmp_path: Path) -> None:
    supervised = Supervised(tmp_path, ["run"], grace=0.3, deadline_in=30.0)
    supervised.child()
    closed = time.monotonic()
    os.close(supervised.pipe)
    code = supervised.proc.wait(10)
    child = terms(supervised.records)[0]
    assert code == 0 and child.stopped and child.end - closed < 0.1, child


def test_a_stop_line_sigkills_after_the_grace(tmp_path: Path) -> None:
    supervised = Supervised(tmp_path, ["ignore-term"], grace=0.3, deadline_in=30.0)
    supervised.child()
    told = time.monotonic()
    supervised.tell("stop")
    code, child = supervised.wait()
    assert code == 128 + signal.SIGKILL
    assert 0.25 < child.end - told < 0.3, child


def test_a_sigterm_to_the_supervisor_stops_the_child(tmp_path: Path) -> None:
    supervised = Supervised(tmp_path, ["run"], grace=0.3, deadline_in=30.0)
    supervised.child()
    supervised.proc.send_signal(signal.SIGTERM)
    code, child = supervised.wait()
    assert code == 0 and child.stopped


def test_a_sigkilled_supervisor_takes_the_child_with_it(tmp_path: Path) -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    supervised = Supervised(tmp_path, ["ignore-term"], grace=0.3, deadline_in=30.0)
    supervised.child()
    time.sleep(0.1)
    killed = time.monotonic()
    supervised.proc.kill()
    supervised.proc.wait(5)
    time.sleep(0.3)
    child = terms(supervised.records)[0]
    os.close(supervised.pipe)
    assert not child.stopped and child.end - killed < 0.05, child


def test_the_exit_code_is_the_childs(tmp_path: Path) -> None:
    supervised = Supervised(tmp_path, ["exit", "0.2", "3"], grace=0.3, deadline_in=30.0)
    code, child = supervised.wait()
    assert code == 3 and child.code == 3


def test_no_child_starts_within_the_grace_of_the_deadline(tmp_path: Path) -> None:
    supervised = Supervised(tmp_path, ["run"], grace=1.0, deadline_in=0.5)
    code = supervised.proc.wait(10)
    os.close(supervised.pipe)
    assert code == 125 and not terms(supervised.records)
