"""The store contract's cases for permits, part two: force-release, listings, renewing many
leases, the extremes; and the helpers both parts use (``permit_cases.py`` has part one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from django_locks.durations import MAX_DURATION_MS
from django_locks.exceptions import PermitsMismatchError
from django_locks.holders import Holder
from django_locks.keys import MAX_PERMITS
from django_locks.stores.base import PERMITS_OWNER, LeaseInfo, PermitGrant, Slot
from django_locks.testing.harness import ContractHarness, new_owner


def worker(n: int) -> Holder:
    """A holder of its own for the ``n``-th caller, told apart by its detail."""
    return Holder(host="web-2", pid=4000 + n, kind="worker", detail=f"task-{n}")


class PermitOperationCases(ContractHarness):
    """What a store that offers permits frees, lists and renews in bulk; each case skips itself
    on a store without permits."""

    __test__ = False

    permit_callers: ClassVar[int] = 32
    """How many threads race for the permits of one key."""

    def permitting(self) -> None:
        if not self.store.supports_permits:
            self.skipTest(f"{type(self.store).__name__} does not offer permits")

    def grant(
        self, key: str, owner: str, permits: int, ttl_ms: int = 60_000, n: int = 0
    ) -> PermitGrant:
        """A permit of ``key`` that must be free for ``owner``."""
        got = self.store.acquire_permit(key, owner, ttl_ms, permits, worker(n))
        assert isinstance(got, PermitGrant), f"expected a permit of {key!r}, got {got!r}"
        self.assertIs(type(got.fencing_token), int)
        self.assertTrue(1 <= got.permit <= permits, got)
        return got

    def snapshot(self, *keys: str) -> list[tuple[Any, ...] | None]:
        """What the store lists of ``keys`` (ended leases too), times left aside."""

        def describe(key: str) -> tuple[Any, ...] | None:
            info = self.optional_or_none(lambda: self.store.lease(key, include_inactive=True))
            if info is None:
                return None
            return (info.key, info.state, info.owner, info.fencing_token, info.permits)

        return [describe(key) for key in keys]

    def live(self, key: str) -> LeaseInfo:
        info = self.optional(lambda: self.store.lease(key))
        assert info is not None, f"{key!r} is not listed as held"
        return info

    def expires_in(self, key: str) -> float:
        left = self.live(key).expires_in
        assert left is not None
        return left.total_seconds()

    def mismatch(self, call: Callable[[], object], key: str, permits: int, live: int) -> None:
        """``call()`` raises ``PermitsMismatchError`` naming both permits values."""
        with self.assertRaises(PermitsMismatchError) as raised:
            call()
        error = raised.exception
        self.assertEqual((error.key, error.permits, error.live), (key, permits, live))
        self.assertIn(f"permits={permits}", str(error))
        self.assertIn(f"permits={live}", str(error))

    # Operators.

    def test_force_release_of_the_key_frees_every_slot(self) -> None:
        self.permitting()
        key = self.key()
        owners = [new_owner() for _ in range(3)]
        grants = [self.grant(key, owner, 3) for owner in owners]
        self.assertTrue(self.optional(lambda: self.store.force_release(key)))
        for owner, grant in zip(owners, grants, strict=True):
            self.assertFalse(self.store.renew(Slot(key, grant.permit), owner, 60_000))
        self.assertIsNone(self.optional_or_none(lambda: self.store.lease(key)))
        self.assertFalse(self.store.force_release(key), "nothing held: nothing released")
        token = self.store.acquire(key, new_owner(), 60_000)
        assert token is not None
        self.assertGreater(token, max(grant.fencing_token for grant in grants))

    def test_force_end_of_a_slot_key_frees_that_slot_alone(self) -> None:
        self.permitting()
        key = self.key()
        owners = [new_owner() for _ in range(3)]
        grants = [self.grant(key, owner, 3) for owner in owners]
        self.assertTrue(self.optional(lambda: self.store.force_end(f"{key}#2", "admin alice")))
        if self.store.describes_holders and self.store.keeps_ended_leases:
            info = self.store.lease(f"{key}#2", include_inactive=True)
            assert info is not None
            self.assertEqual(
                (info.state, info.ended, info.ended_by),
                ("released", "force released", "admin alice"),
            )
        renewed = [
            self.store.renew(Slot(key, grant.permit), owner, 60_000)
            for owner, grant in zip(owners, grants, strict=True)
        ]
        self.assertEqual(renewed, [grant.permit != 2 for grant in grants])
        self.assertTrue(self.live(key).is_summary, "the other slots keep the key held")
        self.assertEqual(self.grant(key, new_owner(), 3).permit, 2)

    # Listing.

    def test_leases_list_each_slot_and_the_key_s_summary(self) -> None:
        self.permitting()
        key = self.key()
        grants = [self.grant(key, new_owner(), 3, n=n) for n in range(2)]
        listing = self.optional(self.store.leases)
        mine = {info.key: info for info in listing if info.key.startswith(key)}
        self.assertEqual(set(mine), {key, f"{key}#1", f"{key}#2"})
        summary = mine[key]
        self.assertTrue(summary.is_summary)
        self.assertEqual(
            (summary.state, summary.owner, summary.permits), ("held", PERMITS_OWNER, 3)
        )
        self.assertGreaterEqual(summary.fencing_token, max(g.fencing_token for g in grants))
        for n, grant in enumerate(grants):
            info = mine[f"{key}#{grant.permit}"]
            self.assertFalse(info.is_summary)
            self.assertEqual((info.state, info.permit, info.permits), ("held", grant.permit, 3))
            self.assertEqual(info.fencing_token, grant.fencing_token)
            if self.store.describes_holders:
                assert info.holder_info is not None
                self.assertEqual(info.holder_info.detail, f"task-{n}")
            one = self.store.lease(info.key)
            assert one is not None
            self.assertEqual(
                (one.key, one.owner, one.permit, one.permits),
                (info.key, info.owner, info.permit, 3),
            )
        own = self.store.lease(key)
        assert own is not None
        self.assertEqual((own.owner, own.permit, own.permits), (PERMITS_OWNER, None, 3))

    # Renewing many, ttl and permits extremes.

    def test_renew_many_answers_per_lease_for_slots_of_two_keys_and_plain_keys(self) -> None:
        self.permitting()
        a, b, plain = self.key("a"), self.key("b"), self.key("plain")
        a1, a2, b1, mine = new_owner(), new_owner(), new_owner(), new_owner()
        slot_a1 = Slot(a, self.grant(a, a1, 2).permit)
        slot_a2 = Slot(a, self.grant(a, a2, 2).permit)
        slot_b1 = Slot(b, self.grant(b, b1, 3).permit)
        self.store.acquire(plain, mine, 60_000)
        self.store.acquire(self.key("other"), new_owner(), 60_000)
        self.assertTrue(self.store.release(slot_a2, a2))
        leases: list[tuple[str, str, int]] = [
            (slot_a1, a1, 200_000),
            (plain, mine, 200_000),
            (slot_b1, b1, 200_000),
            (slot_a2, a2, 200_000),  # released: never revived
            (self.key("other"), mine, 200_000),  # another owner's
            (slot_b1, a1, 200_000),  # another owner's slot
            (Slot(b, 3), b1, 200_000),  # a slot nobody holds
        ]
        results = self.optional(lambda: self.store.renew_many(leases))
        self.assertEqual(results, [True, True, True, False, False, False, False])
        for key in (a, b, plain):
            self.assertGreater(self.expires_in(key), 150, key)

    def test_permits_at_both_ttl_extremes(self) -> None:
        self.permitting()
        key, brief = self.key("brief"), new_owner()
        first = self.grant(key, brief, 2, ttl_ms=1)
        self.wait_until_expired(Slot(key, first.permit), brief)
        again = self.grant(key, new_owner(), 2, ttl_ms=1)
        self.assertEqual(again.permit, first.permit)
        self.assertGreater(again.fencing_token, first.fencing_token)
        key, owner, longest = self.key("long"), new_owner(), MAX_DURATION_MS
        grant = self.grant(key, owner, 2, ttl_ms=longest)
        slot = Slot(key, grant.permit)
        self.assertEqual(self.grant(key, owner, 2, ttl_ms=longest), grant)
        self.assertTrue(self.store.renew(slot, owner, longest))
        renewed = self.optional_or_none(lambda: self.store.renew_many([(slot, owner, longest)]))
        if renewed is not None:
            self.assertEqual(renewed, [True])
        if self.optional_or_none(lambda: self.store.lease(key)) is not None:
            for listed in (key, str(slot)):
                self.assertGreater(self.expires_in(listed), longest / 1000 - 3600, listed)
        self.assertTrue(self.store.release(slot, owner))

    def test_two_permits_and_the_most_permits(self) -> None:
        self.permitting()
        key = self.key("two")
        grants = [self.grant(key, new_owner(), 2) for _ in range(2)]
        self.assertEqual(sorted(grant.permit for grant in grants), [1, 2])
        found = self.store.acquire_permit(key, new_owner(), 60_000, 2, worker(3))
        self.assertTrue(found is None or isinstance(found, Holder), found)
        key, owner = self.key("most"), new_owner()
        grant = self.grant(key, owner, MAX_PERMITS)
        self.assertEqual(grant.permit, 1)
        info = self.optional_or_none(lambda: self.store.lease(key))
        if info is not None:
            self.assertEqual(info.permits, MAX_PERMITS)
        self.assertTrue(self.store.release(Slot(key, 1), owner))
