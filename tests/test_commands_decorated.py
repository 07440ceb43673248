"""A decorated management command run by three processes at once, on one shared SQLite store."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.celeryapp.processes import Processes, migrate
from tests.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_three_concurrent_invocations_one_runs_two_exit_0_saying_why(tmp_path: Path) -> None:
    template = tmp_path / "template.sqlite3"
    migrate(template)
    (tmp_path / "run").mkdir()
    processes = Processes(
        tmp_path / "run",
        template,
        "redis://127.0.0.1:1/0",
        locks={"BACKEND": "django_locks.stores.DatabaseStore", "TTL": "2s"},
    )
    out = tmp_path / "ran.txt"
    started = [
        processes.manage("locked_report", "--out", str(out), "--sleep", "0.5") for _ in range(3)
    ]
    results: list[tuple[int, str, str]] = []
    for process in started:
        stdout, stderr = process.communicate(timeout=60)
        results.append((process.returncode, stdout.decode(), stderr.decode()))
    assert [code for code, _, _ in results] == [0, 0, 0], results
    ran = [result for result in results if result[1].startswith("ran with token")]
    skipped = [result for result in results if not result[1]]
    assert len(ran) == 1 and len(skipped) == 2, results
    assert len(out.read_text().splitlines()) == 1
    holder_pid = out.read_text().split()[0]
    for _, _, text in skipped:
        lines = text.splitlines()
        assert len(lines) == 1, text
        assert lines[0].startswith(
            "Skipped locked_report (key 'locked_report:owner'): it runs on another instance "
            "(held by "
        )
        # The holder as the failed acquire named it: the process running the command.
        assert f" pid {holder_pid} (command locked_report) since " in lines[0], lines[0]
        assert ", its hold ends in " in lines[0]


def test_limit_concurrency_runs_two_of_four_invocations_the_others_exit_0_saying_why(
    tmp_path: Path,
) -> None:
    template = tmp_path / "template.sqlite3"
    migrate(template)
    (tmp_path / "run").mkdir()
    processes = Processes(
        tmp_path / "run",
        template,
        "redis://127.0.0.1:1/0",
        locks={"BACKEND": "django_locks.stores.DatabaseStore", "TTL": "2s"},
    )
    out = tmp_path / "ran.txt"
    started = [
        processes.manage("limited_report", "--out", str(out), "--sleep", "3") for _ in range(4)
    ]
    results: list[tuple[int, str, str]] = []
    for process in started:
        stdout, stderr = process.communicate(timeout=60)
        results.append((process.returncode, stdout.decode(), stderr.decode()))
    assert [code for code, _, _ in results] == [0, 0, 0, 0], results
    ran = [result for result in results if result[1].startswith("ran with permit")]
    assert len(ran) == 2, results
    lines = out.read_text().splitlines()
    assert sorted(line.split()[1] for line in lines) == ["1", "2"]  # one run per permit
    for _, printed, text in results:
        if not printed:
            assert (
                "Skipped limited_report (key 'limited:report'): every permit is taken (held by "
            ) in text, text


def database_processes(tmp_path: Path) -> Processes:
    template = tmp_path / "template.sqlite3"
    migrate(template)
    (tmp_path / "run").mkdir()
    return Processes(
        tmp_path / "run",
        template,
        "redis://127.0.0.1:1/0",
        locks={"BACKEND": "django_locks.stores.DatabaseStore", "TTL": "2s"},
    )


def test_a_command_with_on_conflict_raise_exits_non_zero_naming_the_holder(
    tmp_path: Path,
) -> None:
    processes = database_processes(tmp_path)
    started = tmp_path / "started"
    first = processes.manage("raising_report", "--sleep", "5", "--started", str(started))
    eventually(started.exists, timeout=60, what="the first run holds the run lock")
    second = processes.manage("raising_report")
    _, err = second.communicate(timeout=60)
    out, _ = first.communicate(timeout=60)
    assert first.returncode == 0 and out.decode().startswith("ran with token")
    assert second.returncode == 1
    text = err.decode()
    # One line, as Django prints a CommandError: no traceback in the cron mail.
    assert text.startswith("CommandError: Lock 'raising:report' is held by "), text
    assert "Traceback" not in text, text
    assert f" pid {first.pid} (command raising_report) since " in text, text


def test_a_new_command_run_replaces_the_running_one(tmp_path: Path) -> None:
    processes = database_processes(tmp_path)
    out = tmp_path / "runs"
    first = processes.manage("replacing_report", "--out", str(out), "--hold", "60")
    eventually(
        (tmp_path / "runs.started").exists, timeout=60, what="the first run holds the run lock"
    )
    second = processes.manage("replacing_report", "--out", str(out))
    results = [process.communicate(timeout=60) for process in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], results
    lines = [line.split() for line in out.read_text().splitlines()]
    # The running one's signal aborted: it stopped, and its block's end let the new one in.
    assert [(int(pid), how) for pid, _, how in lines] == [
        (first.pid, "PreemptedError"),
        (second.pid, "finished"),
    ]
    assert int(lines[1][1]) > int(lines[0][1])
