"""``Holder``: who holds a lease, as people read it; and how this process describes itself."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import datetime
import os
import sys
from collections.abc import Iterator
from typing import Literal, get_args

from django_locks import process

HolderKind = Literal["worker", "beat", "leader", "command", "task", "web", "process"]
"""Which entry point a holder runs under (SPEC section 2)."""

KINDS: tuple[HolderKind, ...] = get_args(HolderKind)

MAX_DETAIL = 500
"""The longest ``detail`` kept, in characters (the database store's column)."""

LABEL_DETAIL = 40
"""How much of ``detail`` the one-line label shows (a task id, a command's name, a key)."""

_WHAT = {
    "worker": "celery task",
    "beat": "celery beat",
    "leader": "run_leader",
    "command": "command",
    "task": "task",
    "web": "web",
    "process": "",
}


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a lease: the host and process, which entry point (``kind``), which work
    (``detail``: a Celery task id, a command's name, an election key), since when, and when the
    lease frees itself unless renewed (``expires_at``; UTC, on the store's clock). Never the
    owner id: that is the holder's secret. ``str()`` is the one-line label."""

    host: str
    pid: int | None = None
    kind: HolderKind = "process"
    detail: str = ""
    since: datetime.datetime | None = None
    expires_at: datetime.datetime | None = None

    def __str__(self) -> str:
        label = f"{self.host} pid {self.pid}" if self.pid is not None else self.host
        detail = self.detail
        if len(detail) > LABEL_DETAIL:
            detail = detail[: LABEL_DETAIL - 1] + "\N{HORIZONTAL ELLIPSIS}"
        what = " ".join(part for part in (_WHAT.get(self.kind, ""), detail) if part)
        return f"{label} ({what})" if what else label

    @property
    def address(self) -> str:
        """``host:pid``, as stores record where a lease was taken."""
        return f"{self.host}:{self.pid}" if self.pid is not None else self.host

    def describe(self) -> str:
        """The label with its times: "web-2 pid 4121 (celery task 9f1c…) since 14:02:10 UTC,
        frees by 14:02:40 UTC unless renewed"."""
        text = str(self)
        if self.since is not None:
            text += f" since {_clock_time(self.since)}"
        if self.expires_at is not None:
            text += f", frees by {_clock_time(self.expires_at)} unless renewed"
        return text

    @classmethod
    def parse(
        cls,
        address: str,
        *,
        kind: str | None = None,
        detail: str | None = None,
        since: datetime.datetime | None = None,
        expires_at: datetime.datetime | None = None,
    ) -> Holder:
        """A holder from what a store recorded: its ``host:pid`` address (anything else is
        kept whole as the host), and the kind and detail where the store kept them."""
        host, sep, pid = address.rpartition(":")
        if not sep or not pid.isdigit():
            host, pid = address, ""
        return cls(
            host=host,
            pid=int(pid) if pid else None,
            kind=_kind(kind),
            detail=detail or "",
            since=since,
            expires_at=expires_at,
        )


def _kind(value: str | None) -> HolderKind:
    for kind in KINDS:
        if value == kind:
            return kind
    return "process"


def _clock_time(moment: datetime.datetime) -> str:
    utc = moment.astimezone(datetime.UTC) if moment.tzinfo else moment
    return f"{utc:%H:%M:%S} UTC"


# How this process describes itself when it takes a lease.

_entry: tuple[HolderKind, str] | None = None
"""The entry point this process runs under, once known (inherited by a forked child on
purpose: a prefork worker's child is a worker)."""

_detail: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "django_locks_holder_detail", default=None
)

_WEB_SERVERS = frozenset(
    {"gunicorn", "uwsgi", "daphne", "uvicorn", "hypercorn", "granian", "waitress-serve"}
)
_MANAGE = frozenset({"manage.py", "django-admin", "django-admin.py", "__main__.py"})
_TASK_WORKERS = frozenset({"db_worker"})
"""django.tasks worker commands (django-tasks-db's): their process is of kind ``"task"``."""
_TASK_RUNNERS = frozenset({"task", "command", "process"})
"""The kinds whose leases taken during a django.tasks run are of kind ``"task"`` (a web
process running one in ``ImmediateBackend`` stays ``"web"``)."""


def set_entry_point(kind: HolderKind, detail: str = "") -> None:
    """Say which entry point this process runs under, instead of it being read from the
    command line: for a process whose command line does not say (an embedded beat, a custom
    launcher). The package's own entry points are recognised from ``sys.argv``."""
    if kind not in KINDS:
        raise ValueError(f"`kind` must be one of {', '.join(KINDS)}, got {kind!r}")
    global _entry
    _entry = (kind, detail[:MAX_DETAIL])


def entry_point() -> tuple[HolderKind, str]:
    """``(kind, detail)`` of this process: as set, else read once from ``sys.argv``."""
    global _entry
    if _entry is None:
        _entry = _from_argv(sys.argv)
    return _entry


def _from_argv(argv: list[str]) -> tuple[HolderKind, str]:
    if not argv:
        return "process", ""
    program = os.path.basename(argv[0])
    words = [word for word in argv[1:] if not word.startswith("-")]
    if program == "celery" or argv[0].endswith(os.path.join("celery", "__main__.py")):
        if "beat" in words:
            return "beat", ""
        if "worker" in words:
            return "worker", ""
        return "process", ""
    if program in _WEB_SERVERS:
        return "web", ""
    if program in _MANAGE and words:
        command = words[0]
        if command == "runserver":
            return "web", ""
        if command == "run_leader":
            return "leader", ""
        if command in _TASK_WORKERS:
            return "task", ""
        return "command", command[:MAX_DETAIL]
    return "process", ""


@contextlib.contextmanager
def working_on(detail: str) -> Iterator[None]:
    """Leases taken inside describe their work as ``detail`` (a task id, an election key)."""
    token = _detail.set(detail[:MAX_DETAIL])
    try:
        yield
    finally:
        _detail.reset(token)


def this_process() -> Holder:
    """How this process describes itself in the lease it is about to take."""
    kind, detail = entry_point()
    work = _detail.get()
    if work is None:
        seam = sys.modules.get("django_locks.contrib.tasks")
        work = seam.current_result_id() if seam is not None else None
        if work is not None and kind in _TASK_RUNNERS:
            kind = "task"  # a worker command running a django.tasks result
    if work is None and "celery" in sys.modules:
        work = _celery_task_id()
    host, _, pid = process.holder().rpartition(":")
    return Holder(host=host, pid=int(pid), kind=kind, detail=work if work is not None else detail)


def _celery_task_id() -> str | None:
    """The id of the Celery task this thread runs (a worker's run), if any."""
    from django_locks.contrib.celery_compat import current_task

    task = current_task()
    request = getattr(task, "request", None) if task is not None else None
    task_id = getattr(request, "id", None)
    if not isinstance(task_id, str) or getattr(request, "called_directly", True):
        return None
    return task_id[:MAX_DETAIL]
