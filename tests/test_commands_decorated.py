"""A decorated management command run by three processes at once, on one shared SQLite store."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.celeryapp.processes import Processes, migrate

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
