"""What type checkers see of decorated functions (checked by mypy in `make lint`, never run).

A decorated ``def f(n: int) -> int`` keeps its parameters and may return ``None`` (a skipped
run), unless its ``on_conflict`` is ``"raise"`` or ``"retry"``: then its result is kept (a run
that does not run raises); ``@leader_election`` returns the function or class it registers,
unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, assert_type

from django_locks import (
    leader_election,
    limit_concurrency,
    on_one_instance,
    without_overlapping,
)

if TYPE_CHECKING:
    from typing import cast

    from django_locks import Lock

    @without_overlapping
    def bare(n: int) -> int:
        return n

    @without_overlapping("reports:{customer_id}", ttl="1m")
    def called(customer_id: int, *, force: bool = False) -> str:
        return str(customer_id)

    @on_one_instance(key="invoices:nightly-export")
    @without_overlapping()
    def stacked() -> int:
        return 1

    @on_one_instance
    async def coroutine(n: int) -> int:
        return n

    @without_overlapping("strict", on_conflict="raise", wait="5s")
    def strict(n: int) -> int:
        return n

    @without_overlapping("patient", on_conflict="retry", max_retries=5)
    def patient(n: int) -> int:
        return n

    @without_overlapping("replacing", on_conflict="replace", max_hold="1h")
    def replacing(n: int) -> int:
        return n

    @without_overlapping("shared", on_conflict="skip", shared_key=True)
    def shared(n: int) -> int:
        return n

    @limit_concurrency("limited", permits=3, on_conflict="raise")
    def limited(n: int) -> int:
        return n

    @limit_concurrency("limited-skip", permits=3)
    def limited_skip(n: int) -> int:
        return n

    @limit_concurrency("limited-replace", permits=3, on_conflict="replace")
    async def limited_replace(n: int) -> int:
        return n

    @without_overlapping("strict-async", on_conflict="raise")
    async def strict_async(n: int) -> int:
        return n

    @on_one_instance("owned", max_hold="1d")
    @without_overlapping(on_conflict="raise")
    def owned_strict() -> int:
        return 1

    assert_type(strict(1), int)
    assert_type(patient(1), int)
    assert_type(replacing(1), int | None)
    assert_type(shared(1), int | None)
    assert_type(limited(1), int)
    assert_type(limited_skip(1), int | None)
    assert_type(owned_strict(), int | None)  # on_one_instance still skips elsewhere
    assert_type(bare(1), int | None)
    assert_type(called(1, force=True), str | None)
    assert_type(stacked(), int | None)

    async def awaiting() -> None:
        assert_type(await coroutine(1), int | None)
        assert_type(await strict_async(1), int)
        assert_type(await limited_replace(1), int | None)

    @leader_election("inventory:warehouse-feed")
    def feed(lock: Lock) -> None: ...

    @leader_election("inventory:other-feed")
    class Feed:
        def on_leadership_acquired(self, lock: Lock) -> None: ...

    assert_type(feed(cast("Lock", None)), None)
    assert_type(Feed(), Feed)
