"""The store contract's cases for permits (``LockStore.supports_permits``, SPEC sections 4 and 12).

Each case skips itself, with the reason, on a store that does not offer permits.
``LockStoreContract`` includes them (``PermitCases`` and, through it, the second part in
``permit_operation_cases.py``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial

from django_locks.exceptions import PermitsMismatchError
from django_locks.holders import Holder
from django_locks.stores.base import PERMITS_OWNER, PermitGrant, Slot
from django_locks.testing.harness import new_owner
from django_locks.testing.permit_operation_cases import PermitOperationCases, worker


class PermitCases(PermitOperationCases):
    """What a store that offers permits grants, renews, ends, refuses and lists."""

    __test__ = False

    # Races and idempotence.

    def test_of_32_concurrent_callers_with_5_permits_exactly_5_win(self) -> None:
        self.permitting()
        key, highest = self.key(), 0
        for _ in range(self.rounds):
            owners = [new_owner() for _ in range(self.permit_callers)]
            calls: list[Callable[[], PermitGrant | Holder | None]] = [
                partial(self.store.acquire_permit, key, owner, 30_000, 5, worker(n))
                for n, owner in enumerate(owners)
            ]
            results = self.race(calls)
            won = [
                (o, r) for o, r in zip(owners, results, strict=True) if isinstance(r, PermitGrant)
            ]
            self.assertEqual(len(won), 5, f"winners: {won}")
            self.assertEqual(sorted(grant.permit for _, grant in won), [1, 2, 3, 4, 5])
            tokens = [grant.fencing_token for _, grant in won]
            self.assertEqual(len(set(tokens)), 5, f"duplicate tokens: {tokens}")
            self.assertGreater(min(tokens), highest, "every round's tokens above the last's")
            highest = max(tokens)
            lost = [r for r in results if not isinstance(r, PermitGrant)]
            self.assertTrue(all(r is None or isinstance(r, Holder) for r in lost), lost)
            for owner, grant in won:
                self.assertTrue(self.store.release(Slot(key, grant.permit), owner))

    def test_acquire_permit_is_idempotent_for_the_same_owner(self) -> None:
        self.permitting()
        key, owner = self.key(), new_owner()
        first = self.grant(key, owner, 3, ttl_ms=self.short_ttl_ms)
        again = self.grant(key, owner, 3, ttl_ms=60_000)
        self.assertEqual(again, first, "a retry by the same owner gets the same grant")
        self.assertGreater(self.expires_in(str(Slot(key, first.permit))), 30, "and its ttl")
        other = self.grant(key, new_owner(), 3)
        self.assertNotEqual(other.permit, first.permit)
        self.assertGreater(other.fencing_token, first.fencing_token)
        racer = new_owner()
        results = self.race(
            [lambda: self.store.acquire_permit(key, racer, 60_000, 3, worker(9))] * 8
        )
        self.assertEqual(len(set(results)), 1, results)
        self.assertIsInstance(results[0], PermitGrant)

    def test_tokens_grow_across_release_expiry_and_reused_slots(self) -> None:
        self.permitting()
        key, seen = self.key(), []
        for name in (key, key + "#1", key + "#1"):  # the key and a slot key, as plain keys first
            owner = new_owner()
            token = self.store.acquire(name, owner, 60_000)
            assert token is not None
            seen.append(token)
            self.assertTrue(self.store.release(name, owner))
        holders: dict[int, str] = {}
        for round_ in range(6):
            owner = new_owner()
            # Rounds 1, 3, 4 and 5 short: the slots of 1 and 4 are left to expire (by their ttl).
            short = round_ % 2 or round_ == 4
            grant = self.grant(key, owner, 3, ttl_ms=self.short_ttl_ms if short else 60_000)
            self.assertGreater(grant.fencing_token, max(seen), f"round {round_}: {grant}")
            seen.append(grant.fencing_token)
            holders[grant.permit] = owner
            if round_ % 3 == 1:  # a short one left to expire, its slot then reused
                self.wait_until_expired(Slot(key, grant.permit), owner)
            elif round_ % 3 == 2:
                self.assertTrue(self.store.release(Slot(key, grant.permit), owner))
        for permit, owner in holders.items():
            self.store.release(Slot(key, permit), owner)
        token = self.store.acquire(key, new_owner(), 60_000)
        assert token is not None, "every slot ended: the key is free for a plain lock"
        self.assertGreater(token, max(seen))

    # One key, one permits value.

    def test_another_permits_value_on_a_key_with_live_permits_is_refused(self) -> None:
        self.permitting()
        key, owner = self.key(), new_owner()
        self.grant(key, owner, 3)
        keys = [key] + [f"{key}#{n}" for n in range(1, 6)]
        before = self.snapshot(*keys)
        self.mismatch(
            lambda: self.store.acquire_permit(key, new_owner(), 60_000, 5, worker(1)), key, 5, 3
        )
        self.mismatch(lambda: self.store.acquire(key, new_owner(), 60_000), key, 1, 3)
        self.mismatch(lambda: self.store.acquire_as(key, new_owner(), 60_000, worker(2)), key, 1, 3)
        self.assertEqual(self.snapshot(*keys), before, "a refused call writes nothing")
        self.assertTrue(self.store.renew(Slot(key, 1), owner, 60_000))

    def test_permits_on_a_key_with_a_live_plain_lease_are_refused(self) -> None:
        self.permitting()
        key, owner = self.key(), new_owner()
        token = self.store.acquire(key, owner, 60_000)
        keys = [key] + [f"{key}#{n}" for n in range(1, 4)]
        before = self.snapshot(*keys)
        self.mismatch(
            lambda: self.store.acquire_permit(key, new_owner(), 60_000, 3, worker(1)), key, 3, 1
        )
        self.assertEqual(self.snapshot(*keys), before, "a refused call writes nothing")
        self.assertEqual(self.store.acquire(key, owner, 60_000), token, "the plain lease stays")
        self.assertTrue(self.store.release(key, owner))
        self.grant(key, new_owner(), 3)

    def test_a_plain_acquire_of_a_live_slot_key_is_refused(self) -> None:
        self.permitting()
        key, owner = self.key(), new_owner()
        grant = self.grant(key, owner, 3)
        slot = str(Slot(key, grant.permit))
        keys = [key, slot]
        before = self.snapshot(*keys)
        calls: list[Callable[[], object]] = [
            lambda: self.store.acquire(slot, new_owner(), 60_000),
            lambda: self.store.acquire_as(slot, new_owner(), 60_000, worker(1)),
        ]
        for call in calls:
            with self.assertRaises(PermitsMismatchError) as raised:
                call()
            error = raised.exception
            self.assertIn(error.key, (slot, key))
            self.assertEqual((error.permits, error.live), (1, 3))
        self.assertEqual(self.snapshot(*keys), before, "a refused call writes nothing")
        self.assertTrue(self.store.renew(Slot(key, grant.permit), owner, 60_000))

    def test_once_every_slot_ended_the_key_takes_a_plain_lock_or_another_permits_value(
        self,
    ) -> None:
        self.permitting()
        key = self.key()
        owners = [new_owner() for _ in range(3)]
        grants = [self.grant(key, owner, 3) for owner in owners]
        for owner, grant in zip(owners, grants, strict=True):
            self.assertTrue(self.store.release(Slot(key, grant.permit), owner))
        plain = new_owner()
        token = self.store.acquire(key, plain, 60_000)
        assert token is not None
        self.assertGreater(token, max(grant.fencing_token for grant in grants))
        self.assertTrue(self.store.release(key, plain))
        owner = new_owner()
        self.grant(key, owner, 5, ttl_ms=self.short_ttl_ms)
        deadline = self.expiry_deadline()
        while True:  # an expired last slot frees the key as a release does
            try:
                if self.store.acquire_permit(key, new_owner(), 60_000, 2, worker(1)) is not None:
                    break
            except PermitsMismatchError:
                pass
            self.assertLess(time.monotonic(), deadline, "the key's permits=5 never ended")
            time.sleep(0.02)

    # The key's own record.

    def test_while_a_slot_is_live_the_key_is_held_by_permits(self) -> None:
        self.permitting()
        key, owner = self.key(), new_owner()
        grant = self.grant(key, owner, 4)
        info = self.live(key)
        self.assertEqual(
            (info.state, info.owner, info.permits, info.permit), ("held", PERMITS_OWNER, 4, None)
        )
        self.assertTrue(info.is_summary)
        self.assertGreaterEqual(info.fencing_token, grant.fencing_token)
        try:  # a caller of the previous release finds the key held
            self.assertIsNone(self.store.acquire(key, new_owner(), 60_000))
        except PermitsMismatchError as error:
            self.assertEqual((error.permits, error.live), (1, 4))
        self.assertTrue(self.store.release(Slot(key, grant.permit), owner))
        self.assertIsNone(self.store.lease(key), "no live slot: the record is not held")

    def test_a_slot_s_renewal_and_leave_move_the_key_s_expiry(self) -> None:
        self.permitting()
        key, owner = self.key(), new_owner()
        slot = Slot(key, self.grant(key, owner, 3, ttl_ms=10_000).permit)
        self.assertLessEqual(self.expires_in(key), 10)
        self.assertTrue(self.store.renew(slot, owner, 60_000))
        self.assertGreater(self.expires_in(key), 30)
        renewed = self.optional_or_none(lambda: self.store.renew_many([(slot, owner, 200_000)]))
        if renewed is not None:
            self.assertEqual(renewed, [True])
            self.assertGreater(self.expires_in(key), 150)
        self.assertTrue(self.store.leave(slot, owner, 400_000, "lapsed"))
        self.assertGreater(self.expires_in(key), 350)

    def test_ending_a_slot_leaves_the_key_held_until_its_other_slots_end(self) -> None:
        self.permitting()
        key, short, long = self.key(), new_owner(), new_owner()
        first = Slot(key, self.grant(key, short, 3, ttl_ms=60_000).permit)
        second = Slot(key, self.grant(key, long, 3, ttl_ms=300_000).permit)
        self.assertGreater(self.expires_in(key), 250)
        self.assertTrue(self.store.end(second, long, "handed back"))
        left = self.expires_in(key)
        self.assertTrue(30 < left <= 60, f"the key's expiry is its other slot's, got {left}")
        self.assertTrue(self.store.end(first, short, "released"))
        self.assertIsNone(self.store.lease(key))
        self.assertIsNotNone(self.store.acquire(key, new_owner(), 60_000))

    def test_a_slot_s_release_wakes_a_waiter_on_the_key(self) -> None:
        self.permitting()
        key, owner = self.key(), new_owner()
        self.optional(lambda: self.store.wait_for_release(key, 0.01))
        slot = Slot(key, self.grant(key, owner, 2).permit)
        self.grant(key, new_owner(), 2)  # the key stays held: a waiter is woken for a permit
        woken: list[tuple[bool, float]] = []

        def waiter() -> None:
            started = time.monotonic()
            woken.append((self.store.wait_for_release(key, 10), time.monotonic() - started))

        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.3)  # the waiter is listening by now
        self.assertTrue(self.store.release(slot, owner))
        thread.join(15)
        self.assertEqual(len(woken), 1)
        notified, after = woken[0]
        self.assertTrue(notified)
        self.assertLess(after, 5, "the waiter slept through the slot's release")
        self.assertEqual(self.grant(key, new_owner(), 2).permit, slot.permit)

    # A full key, expiry.

    def test_a_full_key_answers_the_holder_whose_lease_ends_first(self) -> None:
        self.permitting()
        key = self.key()
        for n, ttl_ms in enumerate((60_000, 20_000, 40_000)):
            self.grant(key, new_owner(), 3, ttl_ms=ttl_ms, n=n)
        found = self.store.acquire_permit(key, new_owner(), 60_000, 3, worker(7))
        if not self.store.describes_holders:  # it may not say, or not say who
            self.assertTrue(found is None or isinstance(found, Holder), found)
            return
        assert isinstance(found, Holder), f"expected a Holder, got {found!r}"
        self.assertEqual((found.host, found.pid, found.detail), ("web-2", 4001, "task-1"))
        assert found.expires_at is not None
        listed = [self.live(f"{key}#{n}").holder_info for n in (1, 2, 3)]
        ends = [h.expires_at for h in listed if h is not None and h.expires_at is not None]
        self.assertEqual(len(ends), 3)
        self.assertLessEqual(abs((found.expires_at - min(ends)).total_seconds()), 1)

    def test_an_expired_slot_is_taken_again_with_a_higher_token(self) -> None:
        self.permitting()
        key, fleeting = self.key(), new_owner()
        first = self.grant(key, fleeting, 2, ttl_ms=self.short_ttl_ms)
        second = self.grant(key, new_owner(), 2)
        deadline = self.expiry_deadline()
        taker = new_owner()
        while not isinstance(
            got := self.store.acquire_permit(key, taker, 60_000, 2, worker(3)), PermitGrant
        ):
            self.assertLess(time.monotonic(), deadline, "the short slot never expired")
            time.sleep(0.02)
        self.assertEqual(got.permit, first.permit)
        self.assertGreater(got.fencing_token, max(first.fencing_token, second.fencing_token))
        self.assertFalse(self.store.renew(Slot(key, first.permit), fleeting, 60_000))
        self.assertFalse(self.store.release(Slot(key, first.permit), fleeting))
