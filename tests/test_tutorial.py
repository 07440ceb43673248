"""The tutorial, typed along: a new project built from docs/tutorial.rst's snippets, run as printed.

How the page is read:

* A ``.. code-block::`` whose ``:caption:`` is a path is a file of the project: written whole, or
  appended when the caption says ``(add at the end)``. A later snippet of the same file replaces it,
  as the reader replaces the file.
* A ``.. code-block:: console`` runs its ``$`` commands in a shell, in order, in the directory the
  reader is in (``cd`` moves it). The lines under a command are its expected output: each must
  appear, in order (other lines may come between them), with ``...`` matching anything and any
  number matching any number. A command whose expected output shows ``CommandError:`` must exit 1,
  any other 0; a traceback the page does not show fails.
* Console blocks captioned ``Shell 1``, ``Shell 2``, ... run side by side: each shell starts once
  the one before printed its first expected line, and a ``^C`` line sends SIGINT there.
* The setup commands (the virtualenv, ``pip install``) are not run: the suite's virtualenv, with
  the checkout installed, stands in for them; the distribution the page installs must be the one
  ``pyproject.toml`` builds. ``runserver`` is started in the background, and the "Export now" page
  is then used over HTTP as a browser would (the form, its CSRF token, the POST).
* The snippets of a section titled "Optional" (Celery) are written after the rest has run, then
  imported and their task called once (no broker needed for that).

Everything is a real process: ``django-admin`` and ``manage.py`` from the suite's virtualenv, the
helpers in ``tests/tutorial/``, SQLite files in a temporary directory.
"""

from __future__ import annotations

import dataclasses
import http.cookiejar
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.waiting import eventually

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "tutorial.rst"
HELPERS = Path(__file__).resolve().parent / "tutorial"
BIN = Path(sys.executable).parent
DIRECTIVE = re.compile(r"^(?P<indent>\s*)\.\. code-block:: (?P<language>\S+)\s*$")
OPTION = re.compile(r"^\s+:(?P<name>[\w-]+):\s*(?P<value>.*)$")
PATH = re.compile(r"^(?P<path>[\w./-]+\.\w+)(?P<append> \(add at the end\))?$")
SHELL = re.compile(r"^Shell (?P<number>\d+)$")
SETUP = ("python -m venv ", "source ", "python -m pip install ")
INTERRUPT = "^C"
TIMEOUT = 60.0  # one command, or one expected line of a shell


@dataclasses.dataclass
class Snippet:
    line: int
    language: str
    caption: str
    code: str
    section: str

    @property
    def path(self) -> str | None:
        match = PATH.match(self.caption)
        return match["path"] if match else None

    @property
    def appends(self) -> bool:
        match = PATH.match(self.caption)
        return bool(match and match["append"])

    @property
    def shell(self) -> int | None:
        match = SHELL.match(self.caption)
        return int(match["number"]) if match else None

    @property
    def optional(self) -> bool:
        return self.section.startswith("Optional")

    def commands(self) -> list[tuple[str, list[str]]]:
        """The ``$`` commands of a console snippet, each with its expected output lines."""
        found: list[tuple[str, list[str]]] = []
        for text in self.code.splitlines():
            if text.startswith("$ "):
                found.append((text[2:].strip(), []))
            elif text.strip():
                assert found, f"tutorial.rst:{self.line}: output before any command"
                found[-1][1].append(text.strip())
        return found


def snippets() -> list[Snippet]:
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    found = []
    section = ""
    for number, text in enumerate(lines):
        below = lines[number + 1] if number + 1 < len(lines) else ""
        if text.strip() and re.fullmatch(r"=+", below) and len(below) >= len(text.strip()):
            section = text.strip()
        match = DIRECTIVE.match(text)
        if match is None:
            continue
        indent = len(match["indent"])
        options: dict[str, str] = {}
        body: list[str] = []
        for following in lines[number + 1 :]:
            if following.strip() and len(following) - len(following.lstrip()) <= indent:
                break  # back at the directive's indentation: the block is over
            option = OPTION.match(following)
            if option and not body:
                options[option["name"]] = option["value"]
            else:
                body.append(following)
        code = "\n".join(body).strip("\n")
        margin = min(len(t) - len(t.lstrip()) for t in code.splitlines() if t.strip())
        code = "\n".join(t[margin:] for t in code.splitlines()) + "\n"
        found.append(
            Snippet(number + 1, match["language"], options.get("caption", ""), code, section)
        )
    return found


def matcher(expected: str) -> re.Pattern[str]:
    """An expected output line as a pattern: ``...`` is anything, a number is any number."""
    parts = []
    for piece in re.split(r"(\.\.\.|\d+)", expected):
        if piece == "...":
            parts.append(".*")
        elif piece.isdigit():
            parts.append(r"\d+")
        else:
            parts.append(re.escape(piece))
    return re.compile("".join(parts))


def check_output(command: str, expected: list[str], output: str) -> None:
    lines = output.splitlines()
    position = 0
    for line in expected:
        if line == INTERRUPT:
            continue  # what the reader types, not what the command prints
        pattern = matcher(line)
        while position < len(lines) and not pattern.search(lines[position]):
            position += 1
        assert position < len(lines), f"{command!r}: no line {line!r} (in order) in:\n{output}"
        position += 1
    if not any(line.startswith("Traceback") for line in expected):
        assert "Traceback (most recent call last)" not in output, f"{command!r}:\n{output}"


def expected_returncode(expected: list[str]) -> int:
    return 1 if any(line.startswith("CommandError:") for line in expected) else 0


class Shell:
    """One command running in one of the reader's shells, its output read as it comes."""

    def __init__(self, command: str, cwd: Path, env: dict[str, str]) -> None:
        self.command = command
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            ["bash", "-c", f"exec {command}"],  # exec: SIGINT reaches Python, as Ctrl-C does
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[tuple[float, str]] = []
        self.position = 0
        self.changed = threading.Condition()
        self.ended: float | None = None
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self) -> None:
        assert self.process.stdout is not None
        for text in self.process.stdout:
            with self.changed:
                self.lines.append((time.monotonic(), text.rstrip("\n")))
                self.changed.notify_all()
        self.process.wait()
        with self.changed:
            self.ended = time.monotonic()
            self.changed.notify_all()

    def expect(self, line: str) -> float:
        """Wait for the next line matching ``line``; return when it was printed."""
        pattern = matcher(line)
        deadline = time.monotonic() + TIMEOUT
        with self.changed:
            while True:
                while self.position < len(self.lines):
                    seen, text = self.lines[self.position]
                    self.position += 1
                    if pattern.search(text):
                        return seen
                if self.ended is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"{self.command!r}: no line {line!r} (in order) in:\n{self.output}"
                    )
                self.changed.wait(0.1)

    def finish(self) -> int:
        try:
            self.process.wait(TIMEOUT)
        finally:
            if self.process.poll() is None:
                self.process.kill()
            self.reader.join(5)
        return self.process.returncode

    @property
    def output(self) -> str:
        return "\n".join(text for _, text in self.lines)

    def at(self, pattern: str) -> float:
        """When the first line matching ``pattern`` was printed."""
        found = [seen for seen, text in self.lines if re.search(pattern, text)]
        assert found, f"{self.command!r}: no {pattern!r} in:\n{self.output}"
        return found[0]


@dataclasses.dataclass
class Group:
    """Commands run side by side in numbered shells."""

    shells: list[Shell]


class Reader:
    """Follows the page: writes its files, runs its commands, records what it saw."""

    def __init__(self, home: Path) -> None:
        self.cwd = home
        clean = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("DJANGO", "PYTEST_", "PYTHON", "VIRTUAL_ENV"))
        }
        # The suite's virtualenv is the reader's activated one; a terminal flushes each line,
        # a pipe would not without PYTHONUNBUFFERED.
        self.env = {
            **clean,
            "PATH": f"{BIN}{os.pathsep}{clean.get('PATH', '')}",
            "VIRTUAL_ENV": str(BIN.parent),
            "PYTHONUNBUFFERED": "1",
        }
        self.groups: list[Group] = []
        self.outputs: list[tuple[str, str]] = []
        self.written: dict[str, str] = {}
        self.setup: list[str] = []
        self.servers: list[str] = []
        self.shells: list[Shell] = []

    def close(self) -> None:
        """Stop what a failed check left running (a leader waiting for its ^C)."""
        for shell in self.shells:
            if shell.process.poll() is None:
                shell.process.kill()
                shell.process.wait()

    @property
    def project(self) -> Path:
        assert (self.cwd / "manage.py").exists(), f"not in the project: {self.cwd}"
        return self.cwd

    def write(self, snippet: Snippet) -> None:
        assert snippet.path is not None
        target = self.cwd / snippet.path
        target.parent.mkdir(parents=True, exist_ok=True)
        if snippet.appends:
            assert target.exists(), f"tutorial.rst:{snippet.line}: {snippet.path} to add to"
            with target.open("a", encoding="utf-8") as file:
                file.write("\n" + snippet.code)
        else:
            target.write_text(snippet.code, encoding="utf-8")
        self.written[snippet.path] = target.read_text(encoding="utf-8")

    def run(self, command: str, expected: list[str]) -> str:
        if command.startswith(SETUP):
            self.setup.append(command)
            return ""
        if command.startswith("cd "):
            self.cwd = (self.cwd / command[3:].strip()).resolve()
            return ""
        if command == "python manage.py runserver":
            self.servers.append(command)
            check_export_now_page(self)
            return ""
        result = subprocess.run(
            ["bash", "-c", command],
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # interleaved as a terminal shows them
            text=True,
            timeout=TIMEOUT * 2,
        )
        output = result.stdout
        assert result.returncode == expected_returncode(expected), f"{command!r}:\n{output}"
        check_output(command, expected, output)
        self.outputs.append((command, output))
        return output

    def run_group(self, blocks: list[Snippet]) -> Group:
        assert [b.shell for b in blocks] == list(range(1, len(blocks) + 1)), blocks
        planned = []
        for block in blocks:
            [(command, expected)] = block.commands()  # one command per shell
            planned.append((command, expected))
        shells: list[Shell] = []
        for command, expected in planned:
            assert expected and expected[0] != INTERRUPT, f"{command!r}: what it prints first"
            shell = Shell(command, self.cwd, self.env)
            shells.append(shell)
            self.shells.append(shell)
            shell.expect(expected[0])  # it is running: start the next shell
        for shell, (command, expected) in zip(shells, planned, strict=True):
            for line in expected[1:]:
                if line == INTERRUPT:
                    shell.process.send_signal(signal.SIGINT)
                else:
                    shell.expect(line)
            code = shell.finish()
            assert code == expected_returncode(expected), (
                f"{command!r} exited {code}:\n{shell.output}"
            )
            check_output(command, expected, shell.output)
        group = Group(shells)
        self.groups.append(group)
        return group


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclasses.dataclass
class Reply:
    status: int
    body: str
    headers: dict[str, str]
    seconds: float


class Browser:
    """The "Export now" page as a browser uses it: GET the form, POST it with its CSRF token."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )

    def request(self, path: str, data: bytes | None = None) -> Reply:
        started = time.monotonic()
        try:
            with self.opener.open(self.base + path, data=data, timeout=TIMEOUT) as response:
                status, body, headers = response.status, response.read(), dict(response.headers)
        except urllib.error.HTTPError as error:
            status, body, headers = error.code, error.read(), dict(error.headers)
        return Reply(status, body.decode(), headers, time.monotonic() - started)

    def press_export_now(self) -> Reply:
        page = self.request("/invoices/export/")
        assert page.status == 200, page
        assert re.search(r'<button type="submit">Export now</button>', page.body), page.body
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.body)
        assert token is not None, page.body
        form = urllib.parse.urlencode({"csrfmiddlewaretoken": token[1]}).encode()
        return self.request("/invoices/export/", form)


@dataclasses.dataclass
class Server:
    process: subprocess.Popen[str]
    browser: Browser
    log: Path

    @property
    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")


def start_server(reader: Reader, command: list[str], name: str) -> Server:
    port = free_port()
    log = reader.project / f"{name}.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [*command, f"127.0.0.1:{port}"],
            cwd=reader.project,
            env=reader.env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    server = Server(process, Browser(f"http://127.0.0.1:{port}"), log)

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            assert process.poll() is None, server.output
            return False
        return True

    eventually(listening, timeout=TIMEOUT, every=0.1, what=lambda: server.output)
    return server


def stop(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(10)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


@dataclasses.dataclass
class Holder:
    """tests/tutorial/hold.py holding a key of the project's store, as a running export does."""

    process: subprocess.Popen[str]
    token: int

    def release(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        assert self.process.wait(TIMEOUT) == 0


def hold(reader: Reader, key: str) -> Holder:
    process = subprocess.Popen(
        [sys.executable, str(HELPERS / "hold.py"), key],
        cwd=reader.project,
        env=reader.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.startswith("held "), line
    return Holder(process, int(line.split()[1]))


def check_export_now_page(reader: Reader) -> None:
    """Step 3 as the page tells it: the button exports, answers 409 while held, 503 in an outage."""
    python = [sys.executable, "manage.py", "runserver", "--noreload"]
    server = start_server(reader, python, "runserver")
    try:
        exported = server.browser.press_export_now()
        assert exported.status == 200, exported
        assert re.fullmatch(r"Exported 3 invoices under fencing token \d+", exported.body)
        assert exported.seconds >= 5  # the stand-in export takes five seconds
        # A run of the command holds the same key: hold it from another process, as it does.
        holder = hold(reader, "invoices:export")
        try:
            refused = server.browser.press_export_now()
        finally:
            holder.release()
        assert (refused.status, refused.body) == (409, "Export already running"), refused
        assert refused.seconds >= 2  # it waited two seconds for the running export
        after = server.browser.press_export_now()
        assert after.status == 200, after
        assert (
            int(after.body.rsplit(" ", 1)[1]) > holder.token > int(exported.body.rsplit(" ", 1)[1])
        )
    finally:
        stop(server)
    assert "Traceback" not in server.output, server.output
    helper = [sys.executable, str(HELPERS / "serve.py")]
    outage = start_server(reader, [*helper, "outage"], "outage")
    try:
        unavailable = outage.browser.press_export_now()
    finally:
        stop(outage)
    assert unavailable.status == 503, (unavailable, outage.output)
    assert unavailable.body == "Exports are unavailable, try again in a minute"
    assert unavailable.headers.get("Retry-After") == "60", unavailable.headers
    # Under ATOMIC_REQUESTS, non_atomic_requests keeps the lock out of the request's transaction:
    # the export runs and nothing warns about a release inside atomic().
    atomic = start_server(reader, [*helper, "atomic"], "atomic")
    try:
        wrapped = atomic.browser.press_export_now()
    finally:
        stop(atomic)
    assert wrapped.status == 200, (wrapped, atomic.output)
    assert "inside transaction.atomic()" not in atomic.output, atomic.output


def check_optional_celery(reader: Reader) -> None:
    result = subprocess.run(
        [sys.executable, str(HELPERS / "celery_check.py")],
        cwd=reader.project,
        env=reader.env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "schedule <crontab: 0 2 * * * (m/h/dM/MY/d)>" in output, output
    assert "run lock free during the run: False" in output, output
    assert "direct call returned 3" in output, output
    reader.run("python manage.py check", ["System check identified no issues (0 silenced)."])


def follow(reader: Reader) -> None:
    """Do what the page says, in its order; the optional part last."""
    page = snippets()
    core = [snippet for snippet in page if not snippet.optional]
    index = 0
    while index < len(core):
        snippet = core[index]
        if snippet.shell == 1:
            group = [snippet]
            while (
                index + len(group) < len(core) and core[index + len(group)].shell == len(group) + 1
            ):
                group.append(core[index + len(group)])
            reader.run_group(group)
            after_group(reader, len(reader.groups) - 1)
            index += len(group)
            continue
        if snippet.path is not None:
            reader.write(snippet)
        elif snippet.language == "console":
            for command, expected in snippet.commands():
                reader.run(command, expected)
        index += 1
    for snippet in page:
        if snippet.optional and snippet.path is not None:
            reader.write(snippet)
    check_optional_celery(reader)


def token(line: str) -> int:
    found = re.search(r"fencing token (\d+)", line)
    assert found is not None, line
    return int(found[1])


def after_group(reader: Reader, number: int) -> None:
    """What the prose after each side-by-side run says, checked while the state is as it says."""
    first, second = reader.groups[number].shells[:2]
    if "run_leader" in first.command:
        # One leads at a time: the second only once the first stepped down, within ttl / 3
        # (10 s with the default 30 s ttl; SQLite polls), and with a greater token.
        stepped_down = first.at(r"^Stepped down from invoices:payments-feed")
        leading = second.at(r"^Leading invoices:payments-feed")
        assert stepped_down <= leading <= stepped_down + 10 + 2, (first.output, second.output)
        assert token(second.output.split("Leading", 1)[1]) > token(first.output)
        return
    # The export: the second shell did not wait for the first, which took its five seconds.
    assert first.ended is not None and second.ended is not None
    assert second.ended < first.at(r"^Exported "), (first.output, second.output)
    # Lines are timed when the reader thread reads them, not when they are printed: under load
    # "Exporting" can be read a little late (CI saw 4.998 s). A job that did not wait would
    # print both at once.
    assert first.at(r"^Exported ") - first.at(r"^Exporting ") >= 5 - 0.5
    if number == 0:
        # "Run it again once the first is done: it exports, under a greater fencing token."
        again = reader.run(
            "python manage.py export_invoices", ["Exporting under fencing token 1...", "Exported"]
        )
        assert token(again) > token(first.output)
    if number == 1:
        # on_one_instance: the hold ends min_hold (30 s) after the first run's start.
        skipped = re.search(r"its hold ends in (\d+)s", second.output)
        assert skipped is not None and 20 <= int(skipped[1]) <= 30, second.output


def test_every_snippet_is_headed_by_its_file_or_shell() -> None:
    for snippet in snippets():
        if snippet.language in {"python", "html+django"}:
            assert snippet.path is not None, f"tutorial.rst:{snippet.line}: {snippet.caption!r}"
        if snippet.shell is not None:
            assert snippet.language == "console" and len(snippet.commands()) == 1


def test_the_page_lists_the_files_it_creates() -> None:
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("What you will build\n", 1)[1].split("\nThe project\n", 1)[0]
    listed = set(re.findall(r"``([\w/]+\.\w+)``", section))
    written = {snippet.path for snippet in snippets() if snippet.path is not None}
    assert listed == written


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_tutorial_builds_a_new_project_that_runs_as_printed(tmp_path: Path) -> None:
    reader = Reader(tmp_path)
    try:
        follow(reader)
    finally:
        reader.close()
    # The setup the suite's virtualenv stands in for installs the distribution this checkout is.
    name = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
    assert f"python -m pip install {name}" in reader.setup, reader.setup
    assert name == "django-distributed-locks"
    assert len(reader.groups) == 3 and reader.servers == ["python manage.py runserver"]
    project = reader.project
    assert (project / "db.sqlite3").exists()  # the default DatabaseStore on startproject's SQLite
    for path, content in reader.written.items():
        assert (project / path).read_text(encoding="utf-8") == content
