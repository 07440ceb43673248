"""The optional capabilities of the store contract: listing, clearing, force-release, time travel,
waiting for a release, renewing many leases at once.

Each case skips itself, with the reason, on a store that raises ``NotImplementedError`` for the
capability (``self.optional(...)``). ``LockStoreContract`` includes these cases.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from django_locks.stores.base import LeaseInfo
from django_locks.testing.harness import WEEK_MS, ContractHarness, new_owner


class OptionalCapabilityCases(ContractHarness):
    """The cases of the contract's optional capabilities (see ``LockStore``'s docstrings)."""

    __test__ = False

    def test_leases_lists_held_leases_and_with_inactive_the_others(self) -> None:
        self.optional(lambda: self.store.leases())
        owner = new_owner()
        token = self.store.acquire(self.key("held"), owner, 60_000)
        released_owner = new_owner()
        self.store.acquire(self.key("released"), released_owner, 60_000)
        self.store.release(self.key("released"), released_owner)
        held = {lease.key: lease for lease in self.store.leases()}
        self.assertIn(self.key("held"), held)
        self.assertNotIn(self.key("released"), held)
        info = held[self.key("held")]
        self.assertEqual((info.state, info.owner, info.fencing_token), ("held", owner, token))
        assert info.expires_in is not None
        self.assertGreater(info.expires_in.total_seconds(), 30)
        self.assertTrue(info.holder)
        everything = self.store.leases(include_inactive=True)
        states = [lease.state for lease in everything]
        self.assertEqual(states, sorted(states, key=lambda s: s != "held"), "held leases first")

    def test_clear_frees_every_lease_and_keeps_tokens(self) -> None:
        token = self.store.acquire(self.key(), new_owner(), 60_000)
        self.optional(self.store.clear)
        again = self.store.acquire(self.key(), new_owner(), 60_000)
        assert token is not None and again is not None
        self.assertGreater(again, token)

    def test_force_release_frees_whoever_holds_the_key(self) -> None:
        owner = new_owner()
        token = self.store.acquire(self.key(), owner, 60_000)
        self.assertTrue(self.optional(lambda: self.store.force_release(self.key())))
        self.assertFalse(self.store.renew(self.key(), owner, 60_000))
        self.assertFalse(self.store.force_release(self.key()))
        again = self.store.acquire(self.key(), new_owner(), 60_000)
        assert token is not None and again is not None
        self.assertGreater(again, token)

    # Time travel (optional, for tests: ManualClock(stores=[...])).

    def test_warp_expires_a_lease_without_waiting_and_keeps_the_token_growing(self) -> None:
        key, first, second = self.key("warped"), new_owner(), new_owner()
        token = self.store.acquire(key, first, 60_000)
        assert token is not None
        self.optional(lambda: self.store.warp(30_000))
        self.assertIsNone(self.store.acquire(key, second, 60_000), "30 s of 60 s: still held")
        self.store.warp(31_000)
        self.assertFalse(self.store.renew(key, first, 60_000), "an expired lease is not revived")
        newer = self.store.acquire(key, second, 60_000)
        self.assertIsNotNone(newer)
        assert newer is not None
        self.assertGreater(newer, token)
        self.assertTrue(self.store.release(key, second))

    def test_warp_leaves_released_leases_and_renewed_time_alone(self) -> None:
        key, owner = self.key("renewed"), new_owner()
        self.assertIsNotNone(self.store.acquire(key, owner, 60_000))
        self.optional(lambda: self.store.warp(50_000))
        self.assertTrue(self.store.renew(key, owner, 60_000))  # 60 s from now again
        self.store.warp(50_000)
        self.assertTrue(self.store.renew(key, owner, 60_000))
        self.assertTrue(self.store.release(key, owner))
        self.store.warp(120_000)
        self.assertFalse(self.store.release(key, owner))

    def test_wait_for_release_wakes_a_waiter_when_the_key_is_released(self) -> None:
        owner = new_owner()
        self.store.acquire(self.key(), owner, 60_000)
        self._assert_release_wakes_a_waiter(lambda: self.store.release(self.key(), owner))

    def test_wait_for_release_wakes_a_waiter_when_an_operator_releases_the_key(self) -> None:
        self.store.acquire(self.key(), new_owner(), 60_000)
        self.optional(lambda: self.store.force_release(self.key("probe")))
        self._assert_release_wakes_a_waiter(lambda: self.store.force_release(self.key()))

    def _assert_release_wakes_a_waiter(self, release: Callable[[], bool]) -> None:
        self.optional(lambda: self.store.wait_for_release(self.key(), 0.01))
        woken: list[tuple[bool, float]] = []

        def waiter() -> None:
            started = time.monotonic()
            woken.append((self.store.wait_for_release(self.key(), 10), time.monotonic() - started))

        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.3)  # the waiter is listening by now
        self.assertTrue(release())
        thread.join(15)
        self.assertEqual(len(woken), 1)
        notified, after = woken[0]
        self.assertTrue(notified)
        self.assertLess(after, 5, "the waiter slept through the release")
        self.assertIsNotNone(self.store.acquire(self.key(), new_owner(), 60_000))

    def test_wait_for_release_times_out_without_a_release(self) -> None:
        self.store.acquire(self.key(), new_owner(), 60_000)
        started = time.monotonic()
        notified = self.optional(lambda: self.store.wait_for_release(self.key(), 0.3))
        self.assertFalse(notified)
        self.assertGreaterEqual(time.monotonic() - started, 0.25)

    def test_renew_many_renews_each_owned_live_lease_and_nothing_else(self) -> None:
        mine, other, gone = new_owner(), new_owner(), new_owner()
        self.store.acquire(self.key("gone"), gone, self.short_ttl_ms)
        self.wait_until_expired(self.key("gone"), gone)  # before "mine", of the same ttl, is taken
        self.store.acquire(self.key("mine"), mine, self.short_ttl_ms)
        self.store.acquire(self.key("other"), other, 60_000)
        leases = [
            (self.key("mine"), mine, 60_000),
            (self.key("other"), mine, 60_000),  # another owner's lease
            (self.key("gone"), gone, 60_000),  # expired: never revived
            (self.key("never"), mine, 60_000),
        ]
        results = self.optional(lambda: self.store.renew_many(leases))
        self.assertEqual(results, [True, False, False, False])
        self.assertEqual(self.store.renew_many([]), [])
        time.sleep(2 * self.short_lease_life())  # "mine" outlives its first ttl
        self.assertIsNone(self.store.acquire(self.key("mine"), new_owner(), 60_000))
        self.assertIsNotNone(self.store.acquire(self.key("gone"), new_owner(), 60_000))

    def test_renew_many_of_a_thousand_leases(self) -> None:
        owner = new_owner()
        keys = [self.key(f"many:{i}") for i in range(1000)]
        for key in keys:
            self.store.acquire(key, owner, 60_000)
        self.store.release(keys[7], owner)
        results = self.optional(
            lambda: self.store.renew_many([(key, owner, 60_000) for key in keys])
        )
        self.assertEqual(results.count(True), 999)
        self.assertFalse(results[7])

    # One key's lease, and pruning ended leases: lease(key), prune(older_than_ms).

    def describe(self, info: LeaseInfo | None) -> tuple[Any, ...] | None:
        """What of a lease stays put between two reads (not its time left)."""
        if info is None:
            return None
        return (info.key, info.state, info.owner, info.holder, info.fencing_token)

    def test_lease_describes_one_live_lease_as_the_listing_does(self) -> None:
        self.assertIsNone(self.optional(lambda: self.store.lease(self.key())))
        owner, other = new_owner(), new_owner()
        token = self.store.acquire(self.key(), owner, 60_000)
        self.store.acquire(self.key() + "2", other, 60_000)  # keys are compared exactly
        self.store.acquire(self.key().upper(), other, 60_000)
        info = self.store.lease(self.key())
        assert info is not None
        self.assertEqual(
            (info.key, info.state, info.owner, info.fencing_token),
            (self.key(), "held", owner, token),
        )
        self.assertTrue(info.holder)
        assert info.expires_in is not None
        self.assertGreater(info.expires_in.total_seconds(), 30)
        listing = self.optional_or_none(self.store.leases)
        if listing is not None:
            listed = {lease.key: lease for lease in listing}.get(self.key())
            self.assertEqual(self.describe(info), self.describe(listed))
        inactive = self.store.lease(self.key(), include_inactive=True)
        self.assertEqual(self.describe(inactive), self.describe(info))

    def test_lease_of_an_ended_lease_is_none_unless_inactive_ones_are_asked_for(self) -> None:
        released, expired = new_owner(), new_owner()
        token = self.store.acquire(self.key("released"), released, 60_000)
        self.optional(lambda: self.store.lease(self.key("released")))
        self.store.release(self.key("released"), released)
        self.store.acquire(self.key("expired"), expired, self.short_ttl_ms)
        self.wait_until_expired(self.key("expired"), expired)
        for name, state in (("released", "released"), ("expired", "expired")):
            self.assertIsNone(self.store.lease(self.key(name)), f"the {name} lease is not live")
            info = self.store.lease(self.key(name), include_inactive=True)
            if info is not None:  # kept by this store (Redis forgets ended leases)
                self.assertEqual((info.key, info.state), (self.key(name), state))
        info = self.store.lease(self.key("released"), include_inactive=True)
        if info is not None:
            self.assertEqual(info.fencing_token, token)
            self.assertIsNone(info.expires_in)
        self.assertIsNone(self.store.lease(self.key("never"), include_inactive=True))

    def test_prune_deletes_only_long_ended_leases_and_no_token_goes_back(self) -> None:
        self.optional(lambda: self.store.prune(WEEK_MS, dry_run=True))
        held, released, expired = new_owner(), new_owner(), new_owner()
        tokens = {
            "held": self.store.acquire(self.key("held"), held, 60_000),
            "released": self.store.acquire(self.key("released"), released, 60_000),
            "expired": self.store.acquire(self.key("expired"), expired, self.short_ttl_ms),
        }
        self.store.release(self.key("released"), released)
        self.wait_until_expired(self.key("expired"), expired)
        kept = self.store.keeps_ended_leases
        # Ended moments ago, not more than a week ago: kept, by a dry run too.
        self.store.prune(WEEK_MS)
        would = self.store.prune(0, dry_run=True)
        self.assertGreaterEqual(would, 2 if kept else 0)
        describes = self.optional_or_none(lambda: self.store.lease(self.key("held"))) is not None
        if kept:
            for name in ("released", "expired"):
                if describes:
                    info = self.store.lease(self.key(name), include_inactive=True)
                    self.assertEqual(info and info.state, name, f"the {name} lease was kept")
            self.assertGreaterEqual(self.store.prune(0, dry_run=True), would)
        pruned = self.store.prune(0)
        if kept:
            self.assertGreaterEqual(pruned, 2)
        else:
            self.assertEqual((would, pruned), (0, 0), "a store keeping no ended lease prunes none")
        for name in ("released", "expired"):
            if describes:
                self.assertIsNone(self.store.lease(self.key(name), include_inactive=True))
        # The held lease is untouched; the pruned keys' tokens still grow.
        self.assertTrue(self.store.renew(self.key("held"), held, 60_000))
        self.assertIsNone(self.store.acquire(self.key("held"), new_owner(), 60_000))
        for name in ("released", "expired"):
            token, before = self.store.acquire(self.key(name), new_owner(), 60_000), tokens[name]
            assert token is not None and before is not None
            self.assertGreater(token, before, f"the pruned {name} key's token went back")

    def test_prune_refuses_a_bad_age_before_any_io(self) -> None:
        self.optional(lambda: self.store.prune(WEEK_MS, dry_run=True))
        for bad, error in (
            (-1, ValueError),
            ("30d", TypeError),
            (True, TypeError),
            (1.5, TypeError),
        ):
            with self.assertRaises(error, msg=repr(bad)) as caught:
                self.store.prune(bad)  # type: ignore[arg-type]
            self.assertIn("older_than_ms", str(caught.exception))
