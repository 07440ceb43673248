"""``run_leader --exec KEY -- COMMAND``: campaign for KEY and run COMMAND only while leading it.

The campaign takes KEY's lease when it is free and starts the supervisor
(:mod:`django_locks.supervise`), which starts COMMAND with the fencing token in
``DJANGO_LOCKS_FENCING_TOKEN``. While leading, each deadline a renewal confirmed goes to the
supervisor over a pipe; the supervisor alone times COMMAND's end (SIGTERM at the deadline minus the
grace, SIGKILL 20 ms before the deadline), so a killed or stopped ``run_leader`` cannot leave
COMMAND running past the lease. When COMMAND exits, the lease is handed back and the campaign waits
(growing waits, ``POLICY.exec_restart_delay``) before it campaigns again. A refused renewal stops
COMMAND at once (SIGKILL after the grace) and the campaign goes on. A stop (SIGTERM or SIGINT to
``run_leader``) is forwarded; the lease is handed back once COMMAND is gone.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Callable

from django_locks.exceptions import LockLostError, StoreError
from django_locks.holders import Holder, working_on
from django_locks.lock import Lock, hand_back
from django_locks.notices import wait_for_release
from django_locks.policy import POLICY
from django_locks.service import Locks

logger = logging.getLogger("django_locks")

TOKEN_VARIABLE = "DJANGO_LOCKS_FENCING_TOKEN"
"""The environment variable holding the fencing token of the term COMMAND runs in."""

NAMED = 80
"""How much of COMMAND (``shlex.join``) the log lines show."""

LOOK_EVERY = 0.02
"""Seconds between the campaign's looks at the lease's deadline while COMMAND runs: a renewal
reaches the supervisor this soon after it was confirmed."""


class ExecCampaign:
    """KEY's campaign with COMMAND as the work (run by ``run_leader --exec``)."""

    def __init__(
        self,
        key: str,
        command: list[str],
        locks: Locks,
        *,
        ttl_ms: int,
        grace: float,
        restart_cap: float,
        stopping: threading.Event,
        report: Callable[[str, int], None] = lambda line, level: None,
    ) -> None:
        self.key = key
        self.command = command
        named = shlex.join(command)
        self.named = (
            named if len(named) <= NAMED else named[: NAMED - 1] + "\N{HORIZONTAL ELLIPSIS}"
        )
        self.locks = locks
        self.ttl_ms = ttl_ms
        self.ttl = ttl_ms / 1000
        self.grace = grace
        self.restart_cap = restart_cap
        self.stopping = stopping
        self.report = report
        self.wake = threading.Event()
        self.exit_code = 0  # of the COMMAND a stop ended; 0 when none ran then
        self._exits = 0  # COMMAND's exits in a row that ran shorter than the cap
        self._leader_seen: str | None = None

    def _say(self, line: str, *args: object, level: int = logging.INFO) -> None:
        logger.log(level, line, *args)
        self.report(line % args, level)

    def run(self) -> int:
        """Campaign until told to stop; the exit code of ``run_leader``."""
        while not self.stopping.is_set():
            try:
                with working_on(self.key):
                    lock = self.locks._acquire(self.key, self.ttl_ms, 0.0, None, self.key, "leader")
            except StoreError as exc:
                self._say("Campaign for %s failed: %s", self.key, exc, level=logging.WARNING)
                self.stopping.wait(POLICY.campaign_every(self.ttl))
                continue
            if not isinstance(lock, Lock):
                self._follow(lock)
                continue
            self._leader_seen = None
            started = self.locks.clock.monotonic()
            outcome, code = self._lead(lock)
            if outcome == "stopped":
                self.exit_code = code
                break
            if outcome == "exited":
                ran = self.locks.clock.monotonic() - started
                self._exits = 1 if ran >= self.restart_cap else self._exits + 1
                delay = POLICY.exec_restart_delay(self._exits, self.restart_cap)
                self._say(
                    "%s after %.1fs: stepped down from %s; campaigning again in %gs",
                    self._ended(code),
                    ran,
                    self.key,
                    delay,
                    level=logging.INFO if code == 0 else logging.WARNING,
                )
                self.stopping.wait(delay)
        return self.exit_code

    def _follow(self, leader: Holder | None) -> None:
        """Say whom this instance follows (once per leader); wait up to ``ttl / 3`` for the
        next campaign, woken early by a release notice."""
        holder = str(leader) if leader is not None else ""
        if self._leader_seen != holder:
            self._leader_seen = holder
            self._say(
                "Following %s: %s leads; campaigning every %gs and when it lets go",
                self.key,
                holder or "another replica",
                POLICY.campaign_every(self.ttl),
            )
        give_up = self.locks.clock.monotonic() + POLICY.campaign_every(self.ttl)
        wait_for_release(
            self.locks.store,
            self.locks.key_prefix + self.key,
            give_up,
            stop=self.stopping,
            monotonic=self.locks.clock.monotonic,
        )

    def _start(self, lock: Lock) -> tuple[subprocess.Popen[bytes], int]:
        """The supervisor, started with the lease's deadline; the pipe's end to write to."""
        read_end, write_end = os.pipe()
        env = dict(os.environ, **{TOKEN_VARIABLE: str(lock.fencing_token)})
        args = [
            sys.executable,
            "-m",
            "django_locks.supervise",
            "--fd",
            str(read_end),
            "--grace",
            repr(self.grace),
            "--deadline",
            repr(lock.deadline),
            "--",
            *self.command,
        ]
        try:
            supervisor = subprocess.Popen(args, env=env, pass_fds=(read_end,))
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        return supervisor, write_end

    def _lead(self, lock: Lock) -> tuple[str, int]:
        """Run COMMAND for this term: ``("exited" | "lost" | "stopped", exit code)``."""
        self._say(
            "Leading %s (fencing token %s): starting %s",
            self.key,
            lock.fencing_token,
            " ".join(self.command),
        )
        self.wake.clear()
        lock.signal.add_callback(lambda _: self.wake.set())
        try:
            supervisor, pipe = self._start(lock)
        except OSError as exc:
            self._say("Cannot start the supervisor: %s", exc, level=logging.ERROR)
            self._release(lock)
            return "exited", 127
        threading.Thread(
            target=self._wait_for,
            args=(supervisor,),
            name=f"django_locks-exec:{self.key}",
            daemon=True,
        ).start()
        told = lock.deadline
        stopped = False
        try:
            while supervisor.poll() is None:
                if self.stopping.is_set() and not stopped:
                    self._say("Stopping %s: SIGTERM forwarded", self.named)
                    stopped = _tell(pipe, "stop")
                elif lock.signal.aborted and not stopped:
                    reason = lock.signal.reason
                    detected = getattr(reason, "detected_by", "")
                    self._say(
                        "Lost the leadership of %s (fencing token %s, detected by %s): stopping %s",
                        self.key,
                        lock.fencing_token,
                        detected or "an abort",
                        self.named,
                        level=logging.WARNING,
                    )
                    stopped = _tell(pipe, "stop")
                elif lock.held and lock.deadline != told:
                    told = lock.deadline
                    _tell(pipe, f"deadline {told!r}")
                self.wake.wait(LOOK_EVERY)
                self.wake.clear()
        finally:
            os.close(pipe)  # the supervisor stops COMMAND if this process goes on without it
            if supervisor.poll() is None:
                supervisor.wait()
        code = supervisor.returncode
        if code < 0:
            # The supervisor itself was killed (COMMAND, under PR_SET_PDEATHSIG, with it).
            self._say(
                "The supervisor of %s was killed by %s; %s was ended with it",
                self.key,
                _signal_name(-code),
                self.named,
                level=logging.WARNING,
            )
            code = 128 - code
        lost = lock.signal.aborted and isinstance(lock.signal.reason, LockLostError)
        self._release(lock)
        if self.stopping.is_set():
            self._say("Stepped down from %s (%s)", self.key, self._ended(code))
            return "stopped", code
        if lost:
            return "lost", code
        return "exited", code

    def _ended(self, code: int) -> str:
        """ "python manage.py crontask exited with code 1", or "... was ended by SIGTERM (143)"
        for the shell's 128 + N."""
        if code > 128 and 0 < code - 128 < signal.NSIG:
            return f"{self.named} was ended by {_signal_name(code - 128)} ({code})"
        return f"{self.named} exited with code {code}"

    def _wait_for(self, supervisor: subprocess.Popen[bytes]) -> None:
        supervisor.wait()
        self.wake.set()

    def _release(self, lock: Lock) -> None:
        try:
            hand_back(lock)
        except StoreError as exc:
            self._say(
                "Releasing %s failed (%s); it lapses within its ttl",
                self.key,
                exc,
                level=logging.WARNING,
            )


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _tell(pipe: int, line: str) -> bool:
    """Write ``line`` to the supervisor (``False``: it is gone already)."""
    try:
        os.write(pipe, line.encode("ascii") + b"\n")
    except OSError:
        return False
    return True
