"""The store contract's cases for preempt requests (``LockStore.supports_preempt``, SPEC sections 4
and 12: what ``on_conflict="replace"`` writes) and for a lease left at its ``max_hold``.

Each preempt case skips itself, with the reason, on a store that does not offer preempt requests
(one checks that such a store refuses ``preempt()`` with ``NotImplementedError``).
``LockStoreContract`` includes them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

from django_locks.stores.base import PREEMPTED, PermitGrant, Slot
from django_locks.testing.harness import new_owner
from django_locks.testing.holder_cases import WORKER, HolderCases
from django_locks.testing.permit_operation_cases import PermitOperationCases


class PreemptCases(HolderCases, PermitOperationCases):
    """What a store that offers preempt requests writes, answers and clears."""

    __test__ = False

    def preempting(self) -> None:
        if not self.store.supports_preempt:
            self.skipTest(f"{type(self.store).__name__} does not offer preempt requests")

    def warped(self, delta_ms: int) -> bool:
        """``warp(delta_ms)``, or ``False`` on a store that cannot travel in time."""
        try:
            self.store.warp(delta_ms)
        except NotImplementedError:
            return False
        return True

    def taken_over(self, key: str) -> tuple[str, int]:
        """Poll until a new owner takes ``key`` (its lease expired); that owner and its token."""
        deadline, owner = self.expiry_deadline(), new_owner()
        while (token := self.store.acquire(key, owner, 60_000)) is None:
            self.assertLess(time.monotonic(), deadline, f"{key!r} never expired")
            time.sleep(0.02)
        return owner, token

    def assert_renews(self, key: str, owner: str) -> None:
        """``owner`` renews its lease on ``key``: ``True`` itself (never a truthy string), one
        at a time and in bulk where the store offers it."""
        self.assertIs(self.store.renew(key, owner, 60_000), True, key)
        renewed = self.optional_or_none(lambda: self.store.renew_many([(key, owner, 60_000)]))
        if renewed is not None:
            self.assertEqual(len(renewed), 1)
            self.assertIs(renewed[0], True, key)

    # The request.

    def test_a_store_without_preempt_requests_refuses_preempt(self) -> None:
        if self.store.supports_preempt:
            self.skipTest(f"{type(self.store).__name__} offers preempt requests")
        owner = new_owner()
        self.store.acquire(self.key(), owner, 60_000)
        with self.assertRaises(NotImplementedError):
            self.store.preempt(self.key())
        self.assertIs(self.store.renew(self.key(), owner, 60_000), True)

    def test_preempt_of_a_free_key_returns_none_and_writes_nothing(self) -> None:
        self.preempting()
        released, expired = new_owner(), new_owner()
        self.store.acquire(self.key("released"), released, 60_000)
        self.store.release(self.key("released"), released)
        self.store.acquire(self.key("expired"), expired, self.short_ttl_ms)
        self.wait_until_expired(self.key("expired"), expired)
        names = ("never", "released", "expired")
        before = self.snapshot(*(self.key(name) for name in names))
        for name in names:
            self.assertIsNone(self.store.preempt(self.key(name)), f"the {name} key is free")
        self.assertEqual(self.snapshot(*(self.key(name) for name in names)), before)
        for name in names:  # no request waits there for the next holder
            owner = new_owner()
            self.assertIsInstance(self.store.acquire(self.key(name), owner, 60_000), int, name)
            self.assert_renews(self.key(name), owner)

    def test_preempt_of_a_held_key_returns_its_token_and_frees_nothing(self) -> None:
        self.preempting()
        self.assertIs(type(self.store).supports_preempt, True, "a class attribute")
        owner, other = new_owner(), new_owner()
        token = self.store.acquire(self.key(), owner, 60_000)
        self.store.acquire(self.key("other"), other, 60_000)
        found = self.store.preempt(self.key())
        self.assertIs(type(found), int)
        self.assertEqual(found, token)
        self.assertEqual(self.store.preempt(self.key()), token, "preempting again: the same")
        self.assertIsNone(self.store.acquire(self.key(), new_owner(), 60_000), "still held")
        self.assertEqual(self.store.acquire(self.key(), owner, 60_000), token)
        self.assert_renews(self.key("other"), other)  # keys are independent
        info = self.optional_or_none(lambda: self.store.lease(self.key()))
        if info is not None:
            self.assertEqual((info.state, info.owner, info.fencing_token), ("held", owner, token))

    # Renewals answer it.

    def test_a_preempted_holder_s_renewal_answers_preempted_and_does_not_extend(self) -> None:
        self.preempting()
        key, owner = self.key(), new_owner()
        token = self.store.acquire(key, owner, 60_000)
        self.assertEqual(self.store.preempt(key), token)
        self.assertEqual(self.store.renew(key, owner, 600_000), PREEMPTED)
        self.assertEqual(self.store.renew(key, owner, 600_000), PREEMPTED, "asked until it ends")
        info = self.optional_or_none(lambda: self.store.lease(key))
        if info is not None:
            assert info.expires_in is not None
            self.assertLessEqual(info.expires_in.total_seconds(), 60, "the lease was extended")
        if not self.warped(30_000):
            return  # the real-time case below shows it lapse
        self.assertIsNone(self.store.acquire(key, new_owner(), 60_000), "30 s of 60 s: held")
        self.assertEqual(self.store.renew(key, owner, 600_000), PREEMPTED)
        self.store.warp(31_000)
        self.assertIs(self.store.renew(key, owner, 600_000), False, "it lapsed at its expiry")
        successor = new_owner()
        newer = self.store.acquire(key, successor, 60_000)
        assert newer is not None and token is not None, "the preempted lease lapsed"
        self.assertGreater(newer, token)
        self.assert_renews(key, successor)

    def test_a_preempted_lease_lapses_at_its_expiry_and_the_next_holder_renews(self) -> None:
        self.preempting()
        key, owner = self.key(), new_owner()
        token = self.store.acquire(key, owner, self.short_ttl_ms)
        self.assertEqual(self.store.preempt(key), token)
        self.assertEqual(self.store.renew(key, owner, 60_000), PREEMPTED)
        # Taken over within short_lease_life() + POLL_LIMIT, far below the 60 s the answered
        # renewal would have extended it to: it was not extended.
        successor, newer = self.taken_over(key)
        assert token is not None
        self.assertGreater(newer, token)
        self.assertIs(self.store.renew(key, owner, 60_000), False)
        self.assert_renews(key, successor)

    def test_another_owner_s_renewal_of_a_preempted_key_is_still_refused(self) -> None:
        self.preempting()
        key, owner, other = self.key(), new_owner(), new_owner()
        self.store.acquire(key, owner, 60_000)
        self.store.preempt(key)
        self.assertIs(self.store.renew(key, other, 60_000), False)
        renewed = self.optional_or_none(lambda: self.store.renew_many([(key, other, 60_000)]))
        if renewed is not None:
            self.assertEqual(len(renewed), 1)
            self.assertIs(renewed[0], False)
        self.assertTrue(self.store.release(key, owner), "the preempted holder releases it")
        self.assertIs(self.store.renew(key, owner, 60_000), False)

    def test_renew_many_answers_renewed_refused_or_preempted_per_lease_in_order(self) -> None:
        self.preempting()
        mine, other = new_owner(), new_owner()
        for name in ("asked", "kept", "asked too"):
            self.store.acquire(self.key(name), mine, 60_000)
        self.store.acquire(self.key("theirs"), other, 60_000)
        for name in ("asked", "asked too", "theirs"):
            self.assertIsNotNone(self.store.preempt(self.key(name)))
        leases = [
            (self.key("asked"), mine, 60_000),
            (self.key("kept"), mine, 60_000),
            (self.key("theirs"), mine, 60_000),  # another owner's, preempted: refused
            (self.key("never"), mine, 60_000),
            (self.key("asked too"), mine, 60_000),
            (self.key("theirs"), other, 60_000),
        ]
        results = self.optional(lambda: self.store.renew_many(leases))
        expected: list[Any] = [PREEMPTED, True, False, False, PREEMPTED, PREEMPTED]
        self.assertEqual(results, expected)
        for result, wanted in zip(results, expected, strict=True):
            if isinstance(wanted, bool):
                self.assertIs(result, wanted, results)

    # A request is for one token: stale ones are ignored, a new lease clears it.

    def test_a_stale_request_never_preempts_the_next_holder(self) -> None:
        self.preempting()
        key, first, second = self.key(), new_owner(), new_owner()
        token = self.store.acquire(key, first, 60_000)
        self.assertEqual(self.store.preempt(key), token)
        self.assertTrue(self.store.release(key, first))
        newer = self.store.acquire(key, second, 60_000)
        assert newer is not None and token is not None
        self.assertGreater(newer, token)
        self.assert_renews(key, second)
        self.assertTrue(self.store.release(key, second))
        again = self.store.acquire(key, first, 60_000)  # the first owner, a new lease
        assert again is not None
        self.assertGreater(again, newer)
        self.assert_renews(key, first)
        self.assertEqual(self.store.preempt(key), again, "a new request names the new token")
        self.assertEqual(self.store.renew(key, first, 60_000), PREEMPTED)

    def test_a_new_lease_taken_with_its_holder_clears_the_request(self) -> None:
        self.preempting()
        key, first, second = self.key(), new_owner(), new_owner()
        self.store.acquire_as(key, first, 60_000, WORKER)
        self.store.preempt(key)
        self.assertTrue(self.store.end(key, first, "released"))
        self.assertIsInstance(self.store.acquire_as(key, second, 60_000, WORKER), int)
        self.assert_renews(key, second)

    def test_the_same_owner_s_idempotent_acquire_keeps_the_request(self) -> None:
        self.preempting()
        key, owner = self.key(), new_owner()
        token = self.store.acquire(key, owner, 60_000)
        self.assertEqual(self.store.preempt(key), token)
        self.assertEqual(self.store.acquire(key, owner, 60_000), token, "the same lease")
        self.assertEqual(self.store.renew(key, owner, 60_000), PREEMPTED)
        self.assertEqual(self.store.acquire_as(key, owner, 60_000, WORKER), token)
        self.assertEqual(self.store.renew(key, owner, 60_000), PREEMPTED)
        self.assertEqual(self.store.preempt(key), token)

    # Permits: the oldest holder is asked.

    def test_preempt_of_a_key_held_by_permits_asks_the_slot_with_the_lowest_token(self) -> None:
        self.preempting()
        self.permitting()
        key = self.key()
        owners = {permit: new_owner() for permit in (1, 2, 3)}
        grants = {p: self.grant(key, owner, 3, n=p) for p, owner in owners.items()}
        self.assertTrue(self.store.release(Slot(key, 1), owners[1]))  # slot 1 taken again:
        owners[1] = new_owner()  # its token is now the highest, slot 2's the lowest
        grants[1] = self.grant(key, owners[1], 3)
        self.assertEqual(grants[1].permit, 1)
        self.assertEqual(self.store.preempt(key), grants[2].fencing_token)
        self.assertEqual(self.store.preempt(key), grants[2].fencing_token, "again: the same")
        answers = {p: self.store.renew(Slot(key, p), owners[p], 60_000) for p in (1, 2, 3)}
        self.assertEqual(answers, {1: True, 2: PREEMPTED, 3: True})
        self.assertIs(answers[1], True)
        renewed = self.optional_or_none(
            lambda: self.store.renew_many([(Slot(key, p), owners[p], 60_000) for p in (3, 2, 1)])
        )
        if renewed is not None:
            self.assertEqual(renewed, [True, PREEMPTED, True])
        self.assertTrue(self.store.release(Slot(key, 2), owners[2]))
        self.assertEqual(self.store.preempt(key), grants[3].fencing_token, "now the oldest")
        owners[2] = new_owner()
        grants[2] = self.grant(key, owners[2], 3)  # slot 2's new lease: not asked
        self.assertEqual(grants[2].permit, 2)
        answers = {p: self.store.renew(Slot(key, p), owners[p], 60_000) for p in (1, 2, 3)}
        self.assertEqual(answers, {1: True, 2: True, 3: PREEMPTED})

    def test_preempt_of_a_key_whose_slots_all_ended_returns_none(self) -> None:
        self.preempting()
        self.permitting()
        key, owner, brief = self.key(), new_owner(), new_owner()
        slot = Slot(key, self.grant(key, owner, 2).permit)
        short = self.grant(key, brief, 2, ttl_ms=self.short_ttl_ms)
        self.assertTrue(self.store.release(slot, owner))
        self.wait_until_expired(Slot(key, short.permit), brief)
        self.assertIsNone(self.store.preempt(key))
        again = new_owner()
        grant = self.store.acquire_permit(key, again, 60_000, 2, WORKER)
        assert isinstance(grant, PermitGrant)
        self.assert_renews(Slot(key, grant.permit), again)

    # Races.

    def test_preempt_racing_release_and_acquirers_never_asks_a_lease_it_did_not_name(
        self,
    ) -> None:
        self.preempting()
        key = self.key()
        preempters = max(1, self.concurrent_callers // 2 - 1)
        for _ in range(self.rounds):
            holder = new_owner()
            token = self.store.acquire(key, holder, 60_000)
            owners = [new_owner() for _ in range(self.concurrent_callers - 1 - preempters)]
            calls: list[Callable[[], Any]] = [partial(self.store.release, key, holder)]
            calls += [partial(self.store.preempt, key)] * preempters
            calls += [partial(self.store.acquire, key, o, 60_000) for o in owners]
            results = self.race(calls)
            self.assertTrue(results[0])
            named = set(results[1 : 1 + preempters])
            won = [(o, t) for o, t in zip(owners, results[1 + preempters :], strict=True) if t]
            self.assertLessEqual(len(won), 1, won)
            self.assertLessEqual(named, {None, token} | {t for _, t in won}, named)
            for owner, won_token in won:
                answer = self.store.renew(key, owner, 60_000)
                self.assertEqual(answer, PREEMPTED if won_token in named else True)
                self.assertTrue(self.store.release(key, owner))

    # A lease left at its max_hold (every store: LeaveReason "max hold").

    def test_a_lease_left_at_max_hold_is_held_until_it_lapses_then_ends_as_max_hold(
        self,
    ) -> None:
        key, owner = self.key(), new_owner()
        self.store.acquire(key, owner, 60_000)
        warps = self.warped(0)
        ttl_ms = 60_000 if warps else self.short_ttl_ms
        self.assertTrue(self.store.leave(key, owner, ttl_ms, "max hold"))
        self.assertIsNone(self.store.acquire(key, new_owner(), 60_000), "held until it lapses")
        kept = self.store.describes_holders and self.store.keeps_ended_leases
        if kept:
            info = self.listed(key)
            self.assertEqual((info.state, info.ended), ("held", None))
        if warps:
            self.store.warp(ttl_ms + 1_000)
        if kept:
            ended = self.ended_by_expiry(key)
            self.assertEqual((ended.state, ended.ended), ("expired", "max hold"))
        self.taken_over(key)
        self.assertIs(self.store.renew(key, owner, 60_000), False, "never revived")
