"""The store contract's cases for holders and how leases end (``LockStore.describes_holders``).

Each case skips itself, with the reason, on a store that does not describe its holders; the cases
of ended leases also on a store that keeps none (``keeps_ended_leases``). ``LockStoreContract``
includes them.
"""

from __future__ import annotations

import datetime
import time

from django_locks.holders import Holder
from django_locks.stores.base import LeaseInfo
from django_locks.testing.harness import ContractHarness, new_owner

WORKER = Holder(host="web-2", pid=4121, kind="worker", detail="9f1c2b7e-task-id")


class HolderCases(ContractHarness):
    """What a store that describes its holders records, returns and lists."""

    __test__ = False

    def describing(self) -> None:
        if not self.store.describes_holders:
            self.skipTest(f"{type(self.store).__name__} does not describe its holders")

    def keeping_ended(self) -> None:
        self.describing()
        if not self.store.keeps_ended_leases:
            self.skipTest(f"{type(self.store).__name__} keeps no ended leases")

    def listed(self, key: str) -> LeaseInfo:
        info = self.store.lease(key, include_inactive=True)
        assert info is not None, f"{key!r} is not listed"
        return info

    def ended_by_expiry(self, key: str) -> LeaseInfo:
        """The listing of ``key`` once its lease expired on the store's clock."""
        deadline = self.expiry_deadline()
        while (info := self.listed(key)).state == "held":
            self.assertLess(time.monotonic(), deadline, f"{key!r} never expired")
            time.sleep(0.02)
        return info

    def test_acquire_as_returns_the_token_and_records_the_holder(self) -> None:
        self.describing()
        key, owner = self.key(), new_owner()
        before = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=5)
        token = self.store.acquire_as(key, owner, 60_000, WORKER)
        self.assertIs(type(token), int)
        self.assertEqual(self.store.acquire_as(key, owner, 60_000, WORKER), token, "idempotent")
        info = self.listed(key)
        holder = info.holder_info
        assert holder is not None, "a store that describes holders fills holder_info"
        self.assertEqual(
            (holder.host, holder.pid, holder.kind, holder.detail),
            (WORKER.host, WORKER.pid, WORKER.kind, WORKER.detail),
        )
        self.assertEqual(info.holder, str(holder), "holder is the one-line label")
        assert holder.since is not None and holder.expires_at is not None
        self.assertGreater(holder.since, before)
        self.assertGreater(holder.expires_at, holder.since + datetime.timedelta(seconds=50))
        self.assertIsNone(info.ended)

    def test_a_re_acquire_by_the_same_owner_records_the_new_holder(self) -> None:
        # The same owner from another process (an enqueue-time lease taken over by the worker
        # that runs its message, django_locks.unique): same token, the new holder. (No
        # docstring: unittest prints a case's docstring in the runner's list of cases.)
        self.describing()
        key, owner = self.key(), new_owner()
        enqueuer = Holder(host="web-1", pid=77, kind="web", detail="nonce-1")
        token = self.store.acquire_as(key, owner, 60_000, enqueuer)
        self.assertEqual(self.store.acquire_as(key, owner, 60_000, WORKER), token)
        holder = self.listed(key).holder_info
        assert holder is not None
        self.assertEqual(
            (holder.host, holder.pid, holder.kind, holder.detail),
            (WORKER.host, WORKER.pid, WORKER.kind, WORKER.detail),
        )

    def test_a_failed_acquire_as_returns_who_holds_the_key(self) -> None:
        self.describing()
        key, owner = self.key(), new_owner()
        self.store.acquire_as(key, owner, 60_000, WORKER)
        other = Holder(host="web-3", pid=7, kind="web", detail="")
        found = self.store.acquire_as(key, new_owner(), 60_000, other)
        assert isinstance(found, Holder), f"expected the holder, got {found!r}"
        self.assertEqual(
            (found.host, found.pid, found.kind, found.detail),
            (WORKER.host, WORKER.pid, WORKER.kind, WORKER.detail),
        )
        assert found.since is not None and found.expires_at is not None
        self.assertGreater(found.expires_at, datetime.datetime.now(datetime.UTC))
        self.assertNotIn(owner, repr(found), "the owner id is the holder's secret")

    def test_a_detail_of_500_characters_is_kept_whole(self) -> None:
        self.describing()
        detail = "détail-✓-" + "x" * 491
        self.assertEqual(len(detail), 500)
        holder = Holder(host="h" * 60, pid=4_194_304, kind="command", detail=detail)
        self.store.acquire_as(self.key(), new_owner(), 60_000, holder)
        found = self.store.acquire_as(self.key(), new_owner(), 60_000, WORKER)
        assert isinstance(found, Holder)
        self.assertEqual((found.host, found.pid, found.detail), (holder.host, holder.pid, detail))
        listed = self.listed(self.key()).holder_info
        assert listed is not None
        self.assertEqual(listed.detail, detail)

    def test_a_renewal_is_recorded_as_the_last_renewal(self) -> None:
        self.describing()
        key, owner = self.key(), new_owner()
        self.store.acquire_as(key, owner, 60_000, WORKER)
        before = self.listed(key).last_renewed
        time.sleep(0.01)
        self.assertTrue(self.store.renew(key, owner, 60_000))
        after = self.listed(key).last_renewed
        assert after is not None, "a store that describes holders records the last renewal"
        if before is not None:
            self.assertGreater(after, before)
        self.assertTrue(self.store.renew_many([(key, owner, 60_000)])[0] is True)
        latest = self.listed(key).last_renewed
        assert latest is not None
        self.assertGreaterEqual(latest, after)

    def test_end_records_released_and_handed_back(self) -> None:
        self.keeping_ended()
        for how in ("released", "handed back"):
            key, owner = self.key(how), new_owner()
            self.store.acquire_as(key, owner, 60_000, WORKER)
            self.assertTrue(self.store.end(key, owner, how))
            self.assertFalse(self.store.end(key, owner, how))
            info = self.listed(key)
            self.assertEqual((info.state, info.ended), ("released", how))

    def test_a_lease_left_to_lapse_is_held_until_then_and_ends_as_left(self) -> None:
        self.keeping_ended()
        for how in ("lapsed", "handed back"):
            key, owner = self.key(how), new_owner()
            self.store.acquire_as(key, owner, 60_000, WORKER)
            self.assertTrue(self.store.leave(key, owner, self.short_ttl_ms, how))
            info = self.listed(key)
            self.assertEqual((info.state, info.ended), ("held", None), "held until it lapses")
            ended = self.ended_by_expiry(key)
            self.assertEqual((ended.state, ended.ended), ("expired", how))

    def test_a_lease_nobody_renewed_ends_as_expired(self) -> None:
        self.keeping_ended()
        key = self.key()
        self.store.acquire_as(key, new_owner(), self.short_ttl_ms, WORKER)
        ended = self.ended_by_expiry(key)
        self.assertEqual((ended.state, ended.ended), ("expired", "expired"))

    def test_a_new_lease_clears_how_the_last_one_was_to_end(self) -> None:
        self.keeping_ended()
        key, first, second = self.key(), new_owner(), new_owner()
        self.store.acquire_as(key, first, 60_000, WORKER)
        self.store.leave(key, first, self.short_ttl_ms, "lapsed")
        self.ended_by_expiry(key)
        self.assertIsInstance(self.store.acquire_as(key, second, self.short_ttl_ms, WORKER), int)
        ended = self.ended_by_expiry(key)
        self.assertEqual(ended.ended, "expired", "a crash is never shown as a clean end")

    def test_a_renewal_clears_a_leave(self) -> None:
        self.keeping_ended()
        key, owner = self.key(), new_owner()
        self.store.acquire_as(key, owner, 60_000, WORKER)
        self.store.leave(key, owner, 60_000, "lapsed")
        self.assertTrue(self.store.renew(key, owner, self.short_ttl_ms))
        self.assertEqual(self.ended_by_expiry(key).ended, "expired")

    def test_force_end_records_who_released_it(self) -> None:
        self.keeping_ended()
        key, owner = self.key(), new_owner()
        self.store.acquire_as(key, owner, 60_000, WORKER)
        self.assertTrue(self.store.force_end(key, "admin alice"))
        self.assertFalse(self.store.renew(key, owner, 60_000))
        self.assertFalse(self.store.force_end(key, "admin bob"), "nothing held: nothing ended")
        info = self.listed(key)
        self.assertEqual(
            (info.state, info.ended, info.ended_by), ("released", "force released", "admin alice")
        )
