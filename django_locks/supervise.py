"""The supervisor of ``run_leader --exec``: runs COMMAND and ends it before the lease can expire.

``run_leader`` starts ``python -m django_locks.supervise --fd N --grace G --deadline D -- COMMAND``
right after it won the key. This process holds the lease's *holder deadline*, never the lease: it
reads each deadline a renewal confirmed from the pipe on fd ``N`` (``deadline <seconds>`` lines, in
``time.monotonic()`` seconds: CLOCK_MONOTONIC, one clock for every process of a Linux machine), and
on its own timer sends SIGTERM to COMMAND's process group at the deadline minus the grace and
SIGKILL 20 ms before the deadline (a timer may wake late), whatever ``run_leader`` does meanwhile
(killed, stopped, hung). A ``stop`` line (a stop, a refused renewal) or the pipe closing
(``run_leader`` is gone) sends SIGTERM at once and SIGKILL after the grace, never later than the
deadline. So does a SIGTERM to this process.

COMMAND runs in a session and process group of its own (a terminal's Ctrl-C reaches
``run_leader``, which forwards it) and, on Linux, with ``PR_SET_PDEATHSIG`` set to SIGKILL: a
supervisor killed outright takes COMMAND with it. When COMMAND ends, whatever it left in its
process group is killed. The exit code is COMMAND's, or 128 + N when signal N ended it (the
shell's convention); 125 when the deadline left no time to start it, 127 when it could not be
started.

Stdlib only (and :mod:`django_locks.process`), no Django: it starts in milliseconds.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from django_locks import process

NOT_STARTED = 125
"""The exit code when the deadline was too near to start COMMAND (``deadline - grace`` passed)."""
KILL_EARLY = 0.02
"""SIGKILL is sent this long before the deadline: the select() timer of a loaded machine wakes
a little late, and COMMAND must be dead by the deadline."""

CANNOT_RUN = 127
"""The exit code when COMMAND could not be started (not found, not executable)."""

POLL = 0.05
"""Seconds between looks at COMMAND where ``os.pidfd_open`` is missing (not Linux)."""

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` giving COMMAND ``PR_SET_PDEATHSIG`` = SIGKILL (Linux; else ``None``).

    The kernel sends it when the thread that forked COMMAND ends: this process is single
    threaded, so when this process ends. A supervisor that died between the fork and the
    ``prctl`` is caught by comparing the parent's pid."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded before the fork: nothing to import after
    prctl = libc.prctl
    parent = process.pid()

    def preexec() -> None:
        if prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() != parent:
            os._exit(CANNOT_RUN)

    return preexec


def _parse(argv: list[str]) -> tuple[int, float, float, list[str]]:
    try:
        split = argv.index("--")
        options, command = argv[:split], argv[split + 1 :]
        values = dict(zip(options[::2], options[1::2], strict=True))
        return int(values["--fd"]), float(values["--grace"]), float(values["--deadline"]), command
    except (ValueError, KeyError) as exc:
        raise SystemExit(
            "usage: python -m django_locks.supervise --fd N --grace SECONDS "
            f"--deadline MONOTONIC -- COMMAND [ARGS...] ({exc})"
        ) from exc


class Supervisor:
    """COMMAND's process group and the two instants that end it."""

    def __init__(self, child: subprocess.Popen[bytes], grace: float, deadline: float) -> None:
        self.child = child
        self.grace = grace
        self.terminate_at = deadline - grace
        self.kill_at = deadline - KILL_EARLY
        self.terminated = False
        self.killed = False

    def signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.child.pid, signum)

    def renewed(self, deadline: float) -> None:
        """A confirmed renewal moved the deadline (ignored once COMMAND is told to stop)."""
        if not self.terminated:
            self.terminate_at = deadline - self.grace
            self.kill_at = deadline - KILL_EARLY

    def stop(self, now: float) -> None:
        """SIGTERM now, SIGKILL after the grace, never later than the deadline."""
        self.terminate_at = min(self.terminate_at, now)
        self.kill_at = min(self.kill_at, now + self.grace - KILL_EARLY)
        self.act(now)

    def act(self, now: float) -> None:
        if not self.terminated and now >= self.terminate_at:
            self.terminated = True
            self.signal_group(signal.SIGTERM)
        if not self.killed and now >= self.kill_at:
            self.killed = True
            self.signal_group(signal.SIGKILL)

    def next_instant(self) -> float:
        return self.kill_at if self.terminated else self.terminate_at


def _read_lines(fd: int, pending: bytearray) -> list[str] | None:
    """The complete lines the pipe holds now (``None``: closed, the parent is gone)."""
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    if not data:
        return None
    pending.extend(data)
    *lines, rest = pending.split(b"\n")
    pending[:] = rest
    return [line.decode("ascii", "replace").strip() for line in lines]


def supervise(fd: int, grace: float, deadline: float, command: list[str]) -> int:
    """Run ``command`` until it exits or the deadline ends it; return the exit code."""
    # A SIGTERM (systemd stopping the unit's whole cgroup) stops COMMAND as a stop line would.
    # SIGINT (a terminal's Ctrl-C reaches the foreground group) is left to run_leader, which
    # forwards it as a stop line. Signals wake the select below through the wakeup fd.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    now = time.monotonic()
    if now >= deadline - grace:
        print(
            f"django_locks.supervise: the lease's deadline is {deadline - now:.3f}s away, "
            f"within the {grace:g}s grace: {command[0]} not started",
            file=sys.stderr,
        )
        return NOT_STARTED
    try:
        child = subprocess.Popen(command, start_new_session=True, preexec_fn=_die_with_parent())
    except OSError as exc:
        print(f"django_locks.supervise: cannot run {command[0]}: {exc}", file=sys.stderr)
        return CANNOT_RUN
    supervisor = Supervisor(child, grace, deadline)
    pidfd = os.pidfd_open(child.pid) if hasattr(os, "pidfd_open") else None
    pipe: int | None = fd
    pending = bytearray()
    while child.poll() is None:
        now = time.monotonic()
        supervisor.act(now)
        timeout = max(supervisor.next_instant() - now, 0.0) if not supervisor.killed else POLL
        if pidfd is None:
            timeout = min(timeout, POLL)
        watched = [w for w in (pipe, pidfd, wake_r) if w is not None]
        readable, _, _ = select.select(watched, [], [], timeout)
        now = time.monotonic()
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                got = os.read(wake_r, 64)
                if signal.SIGTERM in got:
                    supervisor.stop(now)
        if pipe is not None and pipe in readable:
            lines = _read_lines(pipe, pending)
            if lines is None:
                os.close(pipe)
                pipe = None
                supervisor.stop(now)
                continue
            for line in lines:
                word, _, value = line.partition(" ")
                if word == "deadline":
                    supervisor.renewed(float(value))
                elif word == "stop":
                    supervisor.stop(now)
    # Whatever COMMAND left in its group runs without a lease: it ends with COMMAND.
    supervisor.signal_group(signal.SIGKILL)
    code = child.returncode
    return code if code >= 0 else 128 - code


def main() -> None:
    fd, grace, deadline, command = _parse(sys.argv[1:])
    if not command:
        raise SystemExit("django_locks.supervise: no COMMAND after '--'")
    sys.exit(supervise(fd, grace, deadline, command))


if __name__ == "__main__":
    main()
