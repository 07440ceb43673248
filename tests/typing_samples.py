"""What type checkers see of decorated functions (checked by mypy in `make lint`, never run).

A decorated ``def f(n: int) -> int`` keeps its parameters and may return ``None`` (a skipped
run); ``@leader_election`` returns the function or class it registers, unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, assert_type

from django_locks import leader_election, on_one_instance, without_overlapping

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

    assert_type(bare(1), int | None)
    assert_type(called(1, force=True), str | None)
    assert_type(stacked(), int | None)

    async def awaiting() -> None:
        assert_type(await coroutine(1), int | None)

    @leader_election("inventory:warehouse-feed")
    def feed(lock: Lock) -> None: ...

    @leader_election("inventory:other-feed")
    class Feed:
        def on_leadership_acquired(self, lock: Lock) -> None: ...

    assert_type(feed(cast("Lock", None)), None)
    assert_type(Feed(), Feed)
