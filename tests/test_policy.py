"""The renewal policy: one home for every figure, one backoff, the same numbers as before.

The property tests hold the policy to the formulas it replaced, written out here as they stood
in renewal.py, renewal_batch.py, service.py and leader.py: the same floats, for every ttl a lock
may have. The AST rules keep it the one home: no second backoff, no ttl fraction or DRIFT/MARGIN
figure outside ``policy.py``, no class writing another object's private fields.
"""

from __future__ import annotations

import ast
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_locks.durations import MAX_DURATION_MS, MIN_TTL_MS
from django_locks.policy import POLICY, RenewalPolicy

PACKAGE = Path(__file__).resolve().parent.parent / "django_locks"
POLICY_MODULE = PACKAGE / "policy.py"

ttls_ms = st.integers(min_value=MIN_TTL_MS, max_value=MAX_DURATION_MS)
attempts = st.integers(min_value=0, max_value=64)


# The formulas the policy replaced, as they were written.


def old_deadline(sent: float, ttl: float) -> float:
    return sent + ttl * (1 - 0.01) - 0.005


def old_acquire_backoff(attempt: int) -> float:
    delay = min(1.0, 0.025 * 2**attempt)
    return random.uniform(delay / 2, delay)


def old_relaunch_delay(failures: int, ttl: float) -> float:
    delay = min(ttl, min(1.0, ttl / 3) * 2 ** max(failures - 1, 0))
    return random.uniform(delay / 2, delay)


def seeded(seed: int, fn: object, *args: object) -> float:
    random.seed(seed)
    result = fn(*args)  # type: ignore[operator]
    assert isinstance(result, float)
    return result


@given(ttls_ms, st.floats(min_value=0, max_value=1e9))
def test_the_renewal_figures_are_the_old_ones(ttl_ms: int, sent: float) -> None:
    ttl = ttl_ms / 1000
    assert POLICY.period(ttl) == ttl / 3
    assert POLICY.lookahead(ttl) == ttl / 6
    assert POLICY.retry(ttl) == min(ttl / 10, 1.0)
    assert POLICY.deadline(sent, ttl) == old_deadline(sent, ttl)
    assert POLICY.acquire_timeout(ttl_ms) == ttl_ms / 1000 * (1 - 0.01) - 0.005
    assert POLICY.campaign_every(ttl) == ttl / 3
    deadline = old_deadline(sent, ttl)
    assert POLICY.renew_timeout(deadline, sent) == max(deadline - sent, 0.001)
    assert POLICY.call_timeout(deadline, sent) == max(deadline - sent, 0.05)
    assert POLICY.min_ttl_ms == MIN_TTL_MS == 50


@given(ttls_ms)
def test_a_renewal_is_due_well_before_the_deadline(ttl_ms: int) -> None:
    ttl = ttl_ms / 1000
    # Renewed at a third of the ttl, with two thirds left to retry a failed renewal in...
    assert POLICY.period(ttl) < POLICY.deadline(0.0, ttl)
    assert 2 * POLICY.period(ttl) < POLICY.deadline(0.0, ttl)
    # ...the first retry of which is sent before the deadline too, and so is a batch's early one.
    assert POLICY.period(ttl) + POLICY.retry(ttl) < POLICY.deadline(0.0, ttl)
    assert POLICY.lookahead(ttl) < POLICY.period(ttl)
    assert POLICY.acquire_timeout(ttl_ms) > 0


@given(attempts, st.integers(min_value=0, max_value=2**32))
def test_the_acquire_backoff_is_the_old_one(attempt: int, seed: int) -> None:
    assert seeded(seed, POLICY.backoff, attempt) == seeded(seed, old_acquire_backoff, attempt)


@given(attempts, ttls_ms, st.integers(min_value=0, max_value=2**32))
def test_the_campaign_relaunch_delay_is_the_old_one(failures: int, ttl_ms: int, seed: int) -> None:
    ttl = ttl_ms / 1000
    new = seeded(seed, POLICY.relaunch_delay, failures, ttl)
    assert new == seeded(seed, old_relaunch_delay, failures, ttl)


@given(st.integers(min_value=64, max_value=10**30), ttls_ms)
def test_the_backoff_takes_any_attempt(attempt: int, ttl_ms: int) -> None:
    """Past 64 tries every delay is its cap. The old formula raised OverflowError past about
    1060 (a float cannot hold ``0.025 * 2 ** 1100``): a wait of hours makes that many tries when
    release notices wake it often."""
    assert 0.5 <= POLICY.backoff(attempt) <= 1.0
    ttl = ttl_ms / 1000
    assert ttl / 2 <= POLICY.backoff(attempt, cap=ttl, first=1.0) <= ttl
    assert ttl / 2 <= POLICY.relaunch_delay(attempt, ttl) <= ttl


def test_the_policy_is_frozen() -> None:
    with pytest.raises(AttributeError):
        POLICY.drift = 0.5  # type: ignore[misc]
    assert RenewalPolicy() == POLICY


# The AST rules.


def package_modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.relative_to(PACKAGE).parts:
            continue
        yield path, ast.parse(path.read_text(encoding="utf-8"), str(path))


def functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    """``(qualified name, node)`` of the module itself (``""``) and every function in it."""
    if not prefix:
        yield "", tree
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield prefix + node.name, node
            yield from functions(node, prefix + node.name + ".")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, prefix + node.name + ".")


def own_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function's (or module's) body, not of the functions defined in it."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if isinstance(child, ast.ClassDef):
            continue  # its methods are functions of their own; its body is rarely arithmetic
        yield child
        yield from own_nodes(child)


def is_exponential(node: ast.AST) -> bool:
    """``2 ** x``, ``x ** n`` for a non-constant ``n``, or ``math.ldexp(...)``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        base_two = isinstance(node.left, ast.Constant) and node.left.value == 2
        return base_two or not isinstance(node.right, ast.Constant)
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name == "ldexp"
    return False


def backoff_functions(modules: list[tuple[Path, ast.Module]]) -> list[str]:
    found = []
    for path, tree in modules:
        where = path.relative_to(PACKAGE.parent)
        for name, node in functions(tree):
            if "backoff" in name.rsplit(".", 1)[-1].lower() or any(
                is_exponential(child) for child in own_nodes(node)
            ):
                found.append(f"{where}:{name or '<module>'}")
    return found


def test_there_is_one_backoff_function() -> None:
    found = backoff_functions(list(package_modules()))
    assert found == ["django_locks/policy.py:RenewalPolicy.backoff"], found


@pytest.mark.parametrize(
    "source",
    [
        "def _backoff(attempt):\n    return 0.1\n",
        "def delay(attempt):\n    return min(1.0, 0.025 * 2 ** attempt)\n",
        "class Campaign:\n    def wait(self):\n        return self.first * 1.5 ** self.failures\n",
        "import math\nDELAYS = [math.ldexp(0.1, n) for n in range(5)]\n",
    ],
)
def test_the_backoff_rule_finds_a_second_one(source: str) -> None:
    modules = [*package_modules(), (PACKAGE / "second.py", ast.parse(source))]
    assert len(backoff_functions(modules)) == 2


FIGURE_NAMES = {"DRIFT", "MARGIN", "MIN_CALL_TIMEOUT", "MIN_TTL_MS", "BACKOFF_FIRST", "BACKOFF_CAP"}


def mentions_ttl(node: ast.AST) -> bool:
    return any(
        (isinstance(n, ast.Name) and "ttl" in n.id.lower())
        or (isinstance(n, ast.Attribute) and "ttl" in n.attr.lower())
        for n in ast.walk(node)
    )


def is_number(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    )


def figures_outside_the_policy(modules: list[tuple[Path, ast.Module]]) -> list[str]:
    """Every ttl fraction or multiple (``ttl / 3``, ``ttl * 0.99``; ms <-> s conversions by
    1000 aside), every use of DRIFT or MARGIN and every module constant named as a figure,
    outside policy.py."""
    found = []
    for path, tree in modules:
        if path == POLICY_MODULE or "testing" in path.relative_to(PACKAGE).parts:
            continue  # the contract suite's own sleeps are not the policy's
        where = path.relative_to(PACKAGE.parent)
        for stmt in tree.body:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else []
            if isinstance(stmt, ast.AnnAssign):
                targets = [stmt.target]
            for target in targets:
                value = getattr(stmt, "value", None)
                named = isinstance(target, ast.Name) and target.id in FIGURE_NAMES
                if named and value is not None and any(is_number(n) for n in ast.walk(value)):
                    found.append(f"{where}:{stmt.lineno}: {ast.unparse(target)} defined")
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in {"DRIFT", "MARGIN"}:
                found.append(f"{where}:{node.lineno}: {node.id} used")
            if isinstance(node, ast.BinOp) and isinstance(
                node.op, ast.Div | ast.FloorDiv | ast.Mult | ast.Mod
            ):
                for figure, other in ((node.right, node.left), (node.left, node.right)):
                    if is_number(figure) and figure.value != 1000 and mentions_ttl(other):  # type: ignore[attr-defined]
                        found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_renewal_figure_outside_the_policy() -> None:
    assert figures_outside_the_policy(list(package_modules())) == []


@pytest.mark.parametrize(
    "source",
    [
        "DRIFT = 0.01\n",
        "def renew_at(sent, ttl):\n    return sent + ttl / 3\n",
        "class Campaign:\n    def every(self):\n        return self.ttl / 3\n",
        "def deadline(sent, lock):\n    return sent + lock.ttl * 0.99 - 0.005\n",
        "from django_locks.policy import DRIFT\nx = 1 - DRIFT\n",
    ],
)
def test_the_figure_rule_finds_one(source: str) -> None:
    modules = [*package_modules(), (PACKAGE / "second.py", ast.parse(source))]
    assert figures_outside_the_policy(modules)


def private_writes(modules: list[tuple[Path, ast.Module]]) -> list[str]:
    """``x._name = ...`` (or ``+=``, ``del``) where ``x`` is not ``self`` or ``cls``: one object
    writing another's private field."""
    found = []
    for path, tree in modules:
        where = path.relative_to(PACKAGE.parent)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.Delete):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            else:
                continue
            for target in targets:
                for part in ast.walk(target):
                    if (
                        isinstance(part, ast.Attribute)
                        and isinstance(part.ctx, ast.Store | ast.Del)
                        and part.attr.startswith("_")
                        and not part.attr.startswith("__")
                        and not (
                            isinstance(part.value, ast.Name) and part.value.id in {"self", "cls"}
                        )
                    ):
                        found.append(f"{where}:{node.lineno}: {ast.unparse(part)}")
    return found


KEEPING = {
    "abort.py",
    "aio.py",
    "policy.py",
    "renewal.py",
    "renewal_batch.py",
    "service.py",
    "lock.py",
    "ownership.py",
    "process.py",
}
"""The modules that keep a lock: the private-write rule's scope (elsewhere one write remains:
the beat hook's attribute on Celery's scheduler, which marks the instance it wrapped)."""


def test_no_object_writes_another_ones_private_fields() -> None:
    scope = [(path, tree) for path, tree in package_modules() if path.name in KEEPING]
    assert len(scope) == len(KEEPING)
    assert private_writes(scope) == []


def test_the_private_write_rule_finds_one() -> None:
    tree = ast.parse("def take(keeper):\n    keeper._due = False\n    self._due = True\n")
    assert private_writes([(PACKAGE / "second.py", tree)]) == [
        "django_locks/second.py:2: keeper._due"
    ]


def terminal_name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def foreign_internals(modules: list[tuple[Path, ast.Module]]) -> list[str]:
    """A private member (``_x``) of something named as a keeper (``keeper``, ``self._keeper``)
    outside renewal.py, or as a signal (``signal``, ``self._signal``) outside abort.py."""
    homes = {"keeper": PACKAGE / "renewal.py", "signal": PACKAGE / "abort.py"}
    found = []
    for path, tree in modules:
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")):
                continue
            if node.attr.startswith("__"):
                continue
            receiver = terminal_name(node.value).lower()
            for word, home in homes.items():
                if word in receiver and path != home:
                    found.append(
                        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(node)}"
                    )
    return found


def test_keeper_and_signal_internals_stay_in_their_modules() -> None:
    """``RenewalBatch`` goes through ``Keeper.join_round`` / ``answered``, the keeper through
    its ``AbortController``: no ``keeper._in_flight = True``, no ``signal._set(...)``."""
    assert foreign_internals(list(package_modules())) == []


@pytest.mark.parametrize(
    "source",
    [
        "def take(keeper):\n    keeper._in_flight = True\n",
        "class Keeper:\n    def end(self):\n        return self._signal._set(None)\n",
        "def reason(lock):\n    return lock._keeper._reason\n",
    ],
)
def test_the_internals_rule_finds_one(source: str) -> None:
    modules = [*package_modules(), (PACKAGE / "second.py", ast.parse(source))]
    assert foreign_internals(modules)
