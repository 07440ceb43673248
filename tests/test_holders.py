"""``Holder``: its label and description, parsing what stores record, and how a process describes
itself (the entry point read from its command line, the detail of its work)."""

from __future__ import annotations

import datetime
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_locks import Holder, LockNotAcquiredError, Locks
from django_locks.holders import (
    KINDS,
    LABEL_DETAIL,
    MAX_DETAIL,
    _from_argv,
    set_entry_point,
    this_process,
    working_on,
)
from django_locks.stores import InMemoryStore

UTC = datetime.UTC


def test_the_label_is_one_line_with_the_work_shortened() -> None:
    holder = Holder(host="web-2", pid=4121, kind="worker", detail="9f1c2b7e-" + "a" * 40)
    label = str(holder)
    assert label.startswith("web-2 pid 4121 (celery task 9f1c2b7e-")
    assert label.endswith("\N{HORIZONTAL ELLIPSIS})")
    assert len(label) < len("web-2 pid 4121 (celery task )") + LABEL_DETAIL + 1
    assert str(Holder(host="web-2", pid=7)) == "web-2 pid 7"
    assert str(Holder(host="ops", pid=9, kind="command", detail="send_reports")) == (
        "ops pid 9 (command send_reports)"
    )


def test_describe_adds_since_and_when_it_frees_itself() -> None:
    since = datetime.datetime(2026, 12, 1, 14, 2, 10, tzinfo=UTC)
    holder = Holder(
        host="web-2",
        pid=4121,
        kind="beat",
        since=since,
        expires_at=since + datetime.timedelta(seconds=30),
    )
    assert holder.describe() == (
        "web-2 pid 4121 (celery beat) since 14:02:10 UTC, frees by 14:02:40 UTC unless renewed"
    )


@given(
    host=st.text(min_size=1, max_size=80).filter(lambda h: "\x00" not in h),
    pid=st.integers(min_value=0, max_value=2**31),
    kind=st.sampled_from(KINDS),
    detail=st.text(max_size=MAX_DETAIL),
)
def test_parse_reads_back_what_a_store_recorded(
    host: str, pid: int, kind: str, detail: str
) -> None:
    holder = Holder(host=host, pid=pid, kind=kind, detail=detail)  # type: ignore[arg-type]
    assert Holder.parse(holder.address, kind=kind, detail=detail) == holder
    assert "\n" not in str(holder).replace(host, "").replace(detail, "")


def test_parse_keeps_an_address_it_cannot_split_whole() -> None:
    assert Holder.parse("old-style-holder") == Holder(host="old-style-holder", pid=None)
    assert Holder.parse("host:notapid").host == "host:notapid"
    assert Holder.parse("h:1", kind="from-the-future").kind == "process"


@pytest.mark.parametrize(
    ("argv", "entry"),
    [
        (["/venv/bin/celery", "-A", "proj", "worker", "-l", "info"], ("worker", "")),
        (["/venv/bin/celery", "-A", "proj", "beat"], ("beat", "")),
        (["/venv/lib/python3.11/site-packages/celery/__main__.py", "worker"], ("worker", "")),
        (["/venv/bin/gunicorn", "proj.wsgi"], ("web", "")),
        (["manage.py", "runserver"], ("web", "")),
        (["manage.py", "run_leader", "proj.jobs"], ("leader", "")),
        (["manage.py", "db_worker", "--queue-name", "q"], ("task", "")),  # django-tasks-db
        (["./manage.py", "--settings=x", "send_reports", "--all"], ("command", "send_reports")),
        (["/venv/bin/django-admin", "migrate"], ("command", "migrate")),
        (["/venv/bin/pytest", "-q"], ("process", "")),
        ([], ("process", "")),
    ],
)
def test_the_entry_point_is_read_from_the_command_line(
    argv: list[str], entry: tuple[str, str]
) -> None:
    assert _from_argv(argv) == entry


def test_an_entry_point_set_wins_and_a_bad_kind_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("django_locks.holders._entry", None)
    set_entry_point("leader", "nightly")
    assert (this_process().kind, this_process().detail) == ("leader", "nightly")
    with pytest.raises(ValueError, match="`kind` must be one of worker, beat"):
        set_entry_point("wizard")  # type: ignore[arg-type]


def test_the_work_detail_follows_the_context_and_is_bounded() -> None:
    with working_on("election:" + "x" * 1000):
        inside = this_process()
        seen: list[str] = []
        thread = threading.Thread(target=lambda: seen.append(this_process().detail))
        thread.start()
        thread.join()
    assert len(inside.detail) == MAX_DETAIL
    assert inside.detail.startswith("election:")
    assert this_process().detail != inside.detail
    assert seen == [this_process().detail], "a plain thread does not inherit the context"


def test_a_taken_key_names_its_holder_in_the_error() -> None:
    locks = Locks(InMemoryStore())
    with working_on("first-job"):
        held = locks.acquire("report:42")
    assert held is not None
    with pytest.raises(LockNotAcquiredError) as refused:
        with locks.lock("report:42"):
            pass
    holder = refused.value.holder
    assert holder is not None and holder.detail == "first-job"
    assert f"held by {holder.describe()}; not acquired on the first try" in str(refused.value)
    assert held.owner not in str(refused.value) + repr(holder)
    held.release()
