"""``run_leader --exec``'s arguments: COMMAND split off at ``--``, and every rule they keep."""

from __future__ import annotations

import dataclasses
import shutil
from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_locks import leader
from django_locks.durations import ttl_ms, wait_ms
from django_locks.keys import validate_key
from django_locks.policy import POLICY


@dataclasses.dataclass(frozen=True)
class ExecOptions:
    key: str
    command: list[str]
    ttl_ms: int
    grace: float
    restart_cap: float


def split_command(parser: CommandParser) -> CommandParser:
    """Make ``parser`` take everything after the first ``--`` as COMMAND (``options["command"]``,
    ``None`` without a ``--``), from the command line and from ``call_command`` alike."""
    parse_args = parser.parse_args

    def parse(args: Any = None, namespace: Any = None) -> Any:
        args = list(args or [])
        command = None
        if "--" in args:
            split = args.index("--")
            args, command = args[:split], args[split + 1 :]
        options = parse_args(args, namespace)
        options.command = command
        return options

    parser.parse_args = parse  # type: ignore[method-assign]
    return parser


def _usage(message: str) -> CommandError:
    # Usage errors exit 2, as argparse's own do (docs/ref/commands.rst).
    return CommandError(message, returncode=2)


def exec_options(options: dict[str, Any], default_ttl_ms: int) -> ExecOptions | None:
    """The checked ``--exec`` options; ``None`` when ``--exec`` was not given (and neither was
    anything only ``--exec`` takes). Raises ``CommandError`` (exit code 2) naming the rule."""
    key = options.get("exec_key")
    command = options.get("command")
    if key is None:
        if command is not None:
            raise _usage(
                "A COMMAND after '--' needs --exec KEY (run_leader --exec KEY -- COMMAND)."
            )
        if options.get("restart_cap") is not None:
            raise _usage("--restart-cap applies to --exec only.")
        return None
    if options.get("keys"):
        raise _usage(
            f"--exec leads one KEY (its value, {key!r}); remove the other keys "
            f"{', '.join(map(repr, options['keys']))} or run one run_leader for them."
        )
    if options.get("list"):
        raise _usage("--list and --exec do not go together.")
    if not command:
        raise _usage(f"--exec {key} needs a COMMAND after '--': run_leader --exec {key} -- COMMAND")
    if shutil.which(command[0]) is None:
        raise _usage(f"COMMAND {command[0]!r} is not an executable file, nor found on PATH.")
    try:
        validate_key(key, name="--exec")
        lease_ttl = ttl_ms(options["ttl"], name="--ttl") if options.get("ttl") else default_ttl_ms
        ttl = lease_ttl / 1000
        grace_given = options.get("grace")
        grace = (
            wait_ms(grace_given, name="--grace") / 1000
            if grace_given is not None
            else POLICY.exec_grace(ttl)
        )
        cap_given = options.get("restart_cap")
        restart_cap = (
            ttl_ms(cap_given, name="--restart-cap") / 1000
            if cap_given is not None
            else POLICY.exec_restart_cap
        )
    except (TypeError, ValueError) as exc:
        raise _usage(str(exc)) from exc
    if grace > POLICY.exec_max_grace(ttl):
        raise _usage(
            f"--grace {grace:g}s is above ttl/3 ({POLICY.exec_max_grace(ttl):g}s for a {ttl:g}s "
            "ttl): the supervisor sends SIGTERM at the lease's deadline minus the grace, and a "
            "healthy lease is renewed every ttl/3. Lower --grace or raise --ttl."
        )
    election = leader.discover().get(key)
    if election is not None:
        raise _usage(
            f"{key!r} is the key of @leader_election {election.name}; --exec needs a key of "
            "its own (the two would take turns, each stopping the other's work)."
        )
    return ExecOptions(key, list(command), lease_ttl, grace, restart_cap)
