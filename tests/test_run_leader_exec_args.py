"""``run_leader --exec``'s arguments: every bad combination is a usage error (exit code 2)
naming the rule, before anything runs; the grace rule and its default; the crash-loop waits."""

from __future__ import annotations

import dataclasses
import itertools
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command

from django_locks.policy import POLICY
from tests.children.env import ROOT, child_env
from tests.children.exec_fleet import Term, check_one_at_a_time


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--exec", "k"], "needs a COMMAND after '--'"),
        (["--exec", "k", "--"], "needs a COMMAND after '--'"),
        (["--", "true"], "needs --exec KEY"),
        (["--exec", "k", "other", "--", "true"], "--exec leads one KEY"),
        (["--exec", "k", "--list", "--", "true"], "--list and --exec"),
        (["--restart-cap", "5s", "k"], "--restart-cap applies to --exec only"),
        (["--exec", "k", "--", "no-such-command-here"], "not an executable file"),
        (["--exec", "k", "--ttl", "3s", "--grace", "1.5s", "--", "true"], "above ttl/3"),
        (["--exec", "k", "--grace", "11s", "--", "true"], "above ttl/3 (10s for a 30s ttl)"),
        (["--exec", "k", "--ttl", "nope", "--", "true"], "--ttl"),
        (["--exec", "k", "--restart-cap", "0", "--", "true"], "--restart-cap"),
        (["--exec", "", "--", "true"], "--exec"),
        (["--exec", "tests:fenced-writer", "--", "true"], "@leader_election"),
    ],
)
def test_bad_input_is_a_usage_error(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        call_command("run_leader", *args)
    assert err.value.returncode == 2


def test_an_unknown_option_exits_2_from_the_command_line() -> None:
    env = child_env(settings="tests.settings")
    args = [sys.executable, "-m", "django", "run_leader", "--exec", "k", "--bogus", "--", "true"]
    done = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--bogus" in done.stderr


def test_what_follows_the_separator_is_the_command_even_its_options() -> None:
    # Options after '--' are COMMAND's: '--grace 99s' there is not run_leader's (it is refused).
    with pytest.raises(CommandError, match="not an executable file") as err:
        call_command("run_leader", "--exec", "k", "--", "no-such-command", "--grace", "99s")
    assert err.value.returncode == 2


def test_the_default_grace_keeps_the_rule() -> None:
    assert POLICY.exec_grace(30.0) == 8.0  # below Docker's 10 s stop timeout
    assert POLICY.exec_grace(3.0) == 1.0  # ttl / 3 for a short ttl
    for ttl in (0.05, 1.0, 24.0, 3600.0):
        assert POLICY.exec_grace(ttl) <= POLICY.exec_max_grace(ttl)


def test_the_restart_waits_and_their_allowance_double_up_to_the_cap() -> None:
    waits = [POLICY.exec_restart_delay(exits, cap=30.0) for exits in range(1, 8)]
    assert waits == [0.5, 2.0, 5.0, 11.0, 23.0, 30.0, 30.0]
    allowed = [wait + POLICY.exec_restart_allowance for wait in waits[:5]]
    assert all(after == 2 * before for before, after in itertools.pairwise(allowed))
    assert POLICY.exec_restart_delay(1, cap=0.2) == 0.2
    assert POLICY.exec_restart_delay(10**6, cap=60.0) == 60.0


def test_the_overlap_check_finds_two_children_at_once() -> None:
    one = Term(pid=1, instance=0, token=5, start=10.0, end=12.0, stopped=False, code=None)
    two = Term(pid=2, instance=1, token=6, start=11.99, end=13.0, stopped=True, code=0)
    with pytest.raises(AssertionError, match="started 0.0100s before"):
        check_one_at_a_time([one, two])
    assert check_one_at_a_time([one, two], overlap=0.02) == pytest.approx(-0.01)
    older = dataclasses.replace(two, start=12.5, token=4)
    with pytest.raises(AssertionError, match="tokens went back"):
        check_one_at_a_time([one, older])
