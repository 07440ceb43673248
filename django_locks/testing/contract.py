"""``LockStoreContract``: every rule of the store contract, as a test case to subclass.

    from django_locks.testing import LockStoreContract

    class MyStoreContract(LockStoreContract):
        concurrent_callers = 32

        def make_store(self):
            return MyStore(...)

It is a ``TransactionTestCase`` with ``databases = "__all__"``, so it runs under pytest-django
and Django's test runner with the test databases set up. Expiry is real time on the store's
clock: short ttls and polling until a deadline, never "sleep, then assert once".
"""

from __future__ import annotations

import threading
import time
import unicodedata
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, ClassVar, TypeVar

from django.test import TransactionTestCase

from django_locks.durations import MAX_DURATION_MS
from django_locks.stores.base import LockStore

T = TypeVar("T")

WEEK_MS = 7 * 24 * 3600 * 1000
POLL_LIMIT = 10.0
"""Seconds a test polls for a short lease to expire before it fails."""


def _owner() -> str:
    return uuid.uuid4().hex


class LockStoreContract(TransactionTestCase):
    """The store contract of ``django_locks.stores.base.LockStore``, checked on ``make_store()``."""

    databases = "__all__"
    concurrent_callers: ClassVar[int] = 16
    """How many threads race in the concurrent cases."""
    rounds: ClassVar[int] = 5
    """How many times each race is run."""
    short_ttl_ms: ClassVar[int] = 200
    """The ttl of leases that must expire during a test."""

    __test__ = False  # this base class has no store: only subclasses are collected

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__test__" not in cls.__dict__:
            cls.__test__ = True

    def make_store(self) -> LockStore:
        """Return the store under test (a fresh instance per test is fine)."""
        raise NotImplementedError

    def setUp(self) -> None:
        super().setUp()
        if type(self).make_store is LockStoreContract.make_store:
            self.skipTest("make_store() is not overridden: subclass LockStoreContract")
        self.store = self.make_store()
        self.prefix = f"contract:{uuid.uuid4().hex[:8]}:"
        self.addCleanup(self.store.close)

    def key(self, name: str = "k") -> str:
        return self.prefix + name

    def optional(self, call: Callable[[], T]) -> T:
        try:
            return call()
        except NotImplementedError:
            self.skipTest(f"{type(self.store).__name__} does not offer this optional capability")

    def optional_or_none(self, call: Callable[[], T]) -> T | None:
        """``call()``, or ``None`` when the store does not offer that optional capability."""
        try:
            return call()
        except NotImplementedError:
            return None

    def wait_until_expired(self, key: str, owner: str) -> None:
        """Poll until ``owner``'s lease on ``key`` expired on the store's clock.

        ``renew(..., 1)`` keeps at most 1 ms of life left, so the first poll after the lease's
        real expiry sees it gone; it never revives an expired lease.
        """
        deadline = time.monotonic() + POLL_LIMIT
        while self.store.renew(key, owner, 1):
            self.assertLess(time.monotonic(), deadline, f"{key!r} never expired")
            time.sleep(0.02)

    def race(self, calls: list[Callable[[], T]]) -> list[T]:
        """Run ``calls`` in as many threads, all starting at one barrier."""
        barrier = threading.Barrier(len(calls))

        def run(call: Callable[[], T]) -> T:
            barrier.wait(timeout=30)
            return call()

        with ThreadPoolExecutor(max_workers=len(calls)) as pool:
            return list(pool.map(run, calls))

    # Acquire.

    def test_acquire_free_key_returns_a_positive_int_token(self) -> None:
        token = self.store.acquire(self.key(), _owner(), 30_000)
        self.assertIsInstance(token, int)
        assert token is not None
        self.assertGreater(token, 0)

    def test_acquire_held_key_by_another_owner_returns_none(self) -> None:
        self.assertIsNotNone(self.store.acquire(self.key(), _owner(), 30_000))
        self.assertIsNone(self.store.acquire(self.key(), _owner(), 30_000))

    def test_acquire_is_idempotent_for_the_same_owner(self) -> None:
        owner = _owner()
        first = self.store.acquire(self.key(), owner, self.short_ttl_ms)
        again = self.store.acquire(self.key(), owner, 60_000)
        self.assertEqual(first, again, "a retry by the same owner must return the same token")
        # The retry extended the lease to its own ttl: it outlives the first ttl.
        time.sleep(self.short_ttl_ms / 1000 * 2)
        self.assertIsNone(self.store.acquire(self.key(), _owner(), 30_000))
        self.assertTrue(self.store.renew(self.key(), owner, 30_000))

    def test_keys_are_independent(self) -> None:
        self.assertIsNotNone(self.store.acquire(self.key("a"), _owner(), 30_000))
        self.assertIsNotNone(self.store.acquire(self.key("b"), _owner(), 30_000))

    # Renew.

    def test_renew_by_the_owner_extends_the_lease(self) -> None:
        owner = _owner()
        self.store.acquire(self.key(), owner, self.short_ttl_ms)
        self.assertTrue(self.store.renew(self.key(), owner, 60_000))
        time.sleep(self.short_ttl_ms / 1000 * 2)
        self.assertIsNone(self.store.acquire(self.key(), _owner(), 30_000))
        self.assertTrue(self.store.renew(self.key(), owner, 30_000))

    def test_renew_by_another_owner_fails_and_changes_nothing(self) -> None:
        owner = _owner()
        self.store.acquire(self.key(), owner, 30_000)
        self.assertFalse(self.store.renew(self.key(), _owner(), 30_000))
        self.assertFalse(self.store.renew(self.key("never-taken"), owner, 30_000))
        self.assertTrue(self.store.renew(self.key(), owner, 30_000))

    # Release.

    def test_release_frees_the_key_at_once_and_keeps_the_token_floor(self) -> None:
        owner = _owner()
        first = self.store.acquire(self.key(), owner, 30_000)
        self.assertTrue(self.store.release(self.key(), owner))
        second = self.store.acquire(self.key(), _owner(), 30_000)
        assert first is not None and second is not None
        self.assertGreater(second, first)

    def test_release_by_another_owner_does_nothing(self) -> None:
        owner = _owner()
        self.store.acquire(self.key(), owner, 30_000)
        self.assertFalse(self.store.release(self.key(), _owner()))
        self.assertIsNone(self.store.acquire(self.key(), _owner(), 30_000))
        self.assertTrue(self.store.renew(self.key(), owner, 30_000))

    def test_release_twice_returns_false_the_second_time(self) -> None:
        owner = _owner()
        self.store.acquire(self.key(), owner, 30_000)
        self.assertTrue(self.store.release(self.key(), owner))
        self.assertFalse(self.store.release(self.key(), owner))
        self.assertFalse(self.store.renew(self.key(), owner, 30_000))

    def test_released_owner_acquiring_again_gets_a_new_token(self) -> None:
        owner = _owner()
        first = self.store.acquire(self.key(), owner, 30_000)
        self.store.release(self.key(), owner)
        again = self.store.acquire(self.key(), owner, 30_000)
        assert first is not None and again is not None
        self.assertGreater(again, first)

    # Expiry, on the store's clock.

    def test_an_expired_lease_frees_the_key_with_a_greater_token(self) -> None:
        owner = _owner()
        first = self.store.acquire(self.key(), owner, self.short_ttl_ms)
        deadline = time.monotonic() + POLL_LIMIT
        second = None
        while second is None:
            self.assertLess(time.monotonic(), deadline, "the lease never expired")
            time.sleep(0.02)
            second = self.store.acquire(self.key(), _owner(), 30_000)
        assert first is not None
        self.assertGreater(second, first)

    def test_an_expired_lease_cannot_be_renewed_or_released(self) -> None:
        owner = _owner()
        self.store.acquire(self.key(), owner, self.short_ttl_ms)
        self.wait_until_expired(self.key(), owner)
        self.assertFalse(self.store.renew(self.key(), owner, 30_000))
        self.assertFalse(self.store.release(self.key(), owner))
        self.assertIsNotNone(self.store.acquire(self.key(), _owner(), 30_000))

    def test_an_expired_owner_acquiring_again_gets_a_new_token(self) -> None:
        owner = _owner()
        first = self.store.acquire(self.key(), owner, self.short_ttl_ms)
        self.wait_until_expired(self.key(), owner)
        again = self.store.acquire(self.key(), owner, 30_000)
        assert first is not None and again is not None
        self.assertGreater(again, first)

    def test_tokens_grow_across_release_and_expiry(self) -> None:
        tokens = []
        for round_ in range(6):
            owner = _owner()
            token = self.store.acquire(self.key(), owner, self.short_ttl_ms)
            assert token is not None
            tokens.append(token)
            if round_ % 2:
                self.store.release(self.key(), owner)
            else:
                self.wait_until_expired(self.key(), owner)
        self.assertEqual(tokens, sorted(set(tokens)), "tokens must strictly increase")

    def test_week_long_ttls(self) -> None:
        owner = _owner()
        self.assertIsNotNone(self.store.acquire(self.key(), owner, WEEK_MS))
        self.assertIsNone(self.store.acquire(self.key(), _owner(), WEEK_MS))
        self.assertTrue(self.store.renew(self.key(), owner, 4 * WEEK_MS))
        self.assertTrue(self.store.release(self.key(), owner))

    def test_the_shortest_ttl_1_ms(self) -> None:
        owner = _owner()
        token = self.store.acquire(self.key(), owner, 1)
        self.assertIsNotNone(token)
        deadline = time.monotonic() + POLL_LIMIT
        while (other := self.store.acquire(self.key(), _owner(), 1)) is None:
            self.assertLess(time.monotonic(), deadline, "a 1 ms lease never expired")
            time.sleep(0.005)
        assert token is not None
        self.assertGreater(other, token)
        self.wait_until_expired(self.key(), owner)
        self.assertFalse(self.store.renew(self.key(), owner, 1))
        self.assertFalse(self.store.release(self.key(), owner))

    def test_the_longest_ttl_366_days(self) -> None:
        owner, longest = _owner(), MAX_DURATION_MS
        token = self.store.acquire(self.key(), owner, longest)
        self.assertIsNotNone(token)
        self.assertIsNone(self.store.acquire(self.key(), _owner(), longest))
        self.assertEqual(self.store.acquire(self.key(), owner, longest), token)
        self.assertTrue(self.store.renew(self.key(), owner, longest))
        renewed = self.optional_or_none(
            lambda: self.store.renew_many([(self.key(), owner, longest)])
        )
        if renewed is not None:  # a store without renew_many renews one lease per call
            self.assertEqual(renewed, [True])
        listed = self.optional_or_none(lambda: self.store.leases(include_inactive=True))
        if listed is not None:
            (info,) = [lease for lease in listed if lease.key == self.key()]
            assert info.expires_in is not None
            self.assertGreater(info.expires_in.total_seconds(), longest / 1000 - 3600)
        self.assertTrue(self.store.release(self.key(), owner))
        again = self.store.acquire(self.key(), _owner(), longest)
        assert token is not None and again is not None
        self.assertGreater(again, token)

    # Keys.

    def test_500_character_unicode_keys(self) -> None:
        keys = [
            "\U0001d11e" * 500,  # astral characters (4 bytes in UTF-8)
            "é" * 500,
            "x" * 499 + "\u4e2d",
        ]
        for key in keys:
            self.assertEqual(len(key), 500)
            owner = _owner()
            self.assertIsNotNone(self.store.acquire(key, owner, 30_000), key[:10])
            self.assertIsNone(self.store.acquire(key, _owner(), 30_000))
            self.assertTrue(self.store.renew(key, owner, 30_000))
            self.assertTrue(self.store.release(key, owner))

    def test_keys_are_compared_exactly(self) -> None:
        composed = unicodedata.normalize("NFC", "café")
        decomposed = unicodedata.normalize("NFD", "café")
        variants = [
            "Key",
            "key",
            "KEY",
            composed,
            decomposed,
            "a b",
            "a  b",
            "{braces}",
            "{braces",
            "100%",
            "a_b",
            "a'b\"c",
            "back\\slash",
            "tab\tkey",
            "line\nkey",
            "ß",
            "ss",
            "🔒",
        ]
        for variant in variants:
            self.assertIsNotNone(
                self.store.acquire(self.key(variant), _owner(), 30_000),
                f"{variant!r} must be a key of its own",
            )

    # Races.

    def test_exactly_one_of_many_concurrent_callers_wins(self) -> None:
        previous = 0
        for _ in range(self.rounds):
            owners = [_owner() for _ in range(self.concurrent_callers)]
            results = self.race(
                [partial(self.store.acquire, self.key(), o, 30_000) for o in owners]
            )
            winners = [(o, t) for o, t in zip(owners, results, strict=True) if t is not None]
            self.assertEqual(len(winners), 1, f"winners: {winners}")
            owner, token = winners[0]
            self.assertGreater(token, previous)
            previous = token
            self.assertTrue(self.store.release(self.key(), owner))

    def test_exactly_one_caller_wins_an_expired_key(self) -> None:
        holder = _owner()
        first = self.store.acquire(self.key(), holder, self.short_ttl_ms)
        self.wait_until_expired(self.key(), holder)
        owners = [_owner() for _ in range(self.concurrent_callers)]
        results = self.race([partial(self.store.acquire, self.key(), o, 30_000) for o in owners])
        tokens = [t for t in results if t is not None]
        self.assertEqual(len(tokens), 1)
        assert first is not None
        self.assertGreater(tokens[0], first)

    def test_concurrent_callers_on_distinct_keys_all_win_with_distinct_tokens_per_key(self) -> None:
        n = self.concurrent_callers
        results = self.race(
            [partial(self.store.acquire, self.key(f"d{i}"), _owner(), 30_000) for i in range(n)]
        )
        self.assertTrue(all(t is not None for t in results), results)

    def test_same_owner_racing_with_itself_gets_one_token(self) -> None:
        owner = _owner()
        results = self.race(
            [lambda: self.store.acquire(self.key(), owner, 30_000)] * self.concurrent_callers
        )
        self.assertEqual(len(set(results)), 1, results)
        self.assertIsNotNone(results[0])

    def test_release_racing_acquirers_hands_over_to_at_most_one(self) -> None:
        previous = 0
        for _ in range(self.rounds):
            holder = _owner()
            token = self.store.acquire(self.key(), holder, 30_000)
            assert token is not None
            self.assertGreater(token, previous)
            owners = [_owner() for _ in range(self.concurrent_callers - 1)]
            calls: list[Callable[[], Any]] = [partial(self.store.release, self.key(), holder)]
            calls += [partial(self.store.acquire, self.key(), o, 30_000) for o in owners]
            results = self.race(calls)
            self.assertTrue(results[0])
            winners = [(o, t) for o, t in zip(owners, results[1:], strict=True) if t is not None]
            self.assertLessEqual(len(winners), 1, winners)
            for owner, won in winners:
                self.assertGreater(won, token)
                self.store.release(self.key(), owner)
                token = won
            previous = token

    def test_renewals_racing_acquirers_keep_the_lease(self) -> None:
        holder = _owner()
        self.store.acquire(self.key(), holder, 30_000)
        calls: list[Callable[[], Any]] = [lambda: self.store.renew(self.key(), holder, 30_000)] * (
            self.concurrent_callers // 2
        )
        calls += [lambda: self.store.acquire(self.key(), _owner(), 30_000)] * (
            self.concurrent_callers - len(calls)
        )
        results = self.race(calls)
        renewals, acquires = results[: len(results) // 2], results[len(results) // 2 :]
        self.assertTrue(all(r is True for r in renewals), renewals)
        self.assertTrue(all(a is None for a in acquires), acquires)

    # Optional capabilities.

    def test_leases_lists_held_leases_and_with_inactive_the_others(self) -> None:
        self.optional(lambda: self.store.leases())
        owner = _owner()
        token = self.store.acquire(self.key("held"), owner, 60_000)
        released_owner = _owner()
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
        token = self.store.acquire(self.key(), _owner(), 60_000)
        self.optional(self.store.clear)
        again = self.store.acquire(self.key(), _owner(), 60_000)
        assert token is not None and again is not None
        self.assertGreater(again, token)

    def test_force_release_frees_whoever_holds_the_key(self) -> None:
        owner = _owner()
        token = self.store.acquire(self.key(), owner, 60_000)
        self.assertTrue(self.optional(lambda: self.store.force_release(self.key())))
        self.assertFalse(self.store.renew(self.key(), owner, 60_000))
        self.assertFalse(self.store.force_release(self.key()))
        again = self.store.acquire(self.key(), _owner(), 60_000)
        assert token is not None and again is not None
        self.assertGreater(again, token)

    # Time travel (optional, for tests: ManualClock(stores=[...])).

    def test_warp_expires_a_lease_without_waiting_and_keeps_the_token_growing(self) -> None:
        key, first, second = self.key("warped"), _owner(), _owner()
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
        key, owner = self.key("renewed"), _owner()
        self.assertIsNotNone(self.store.acquire(key, owner, 60_000))
        self.optional(lambda: self.store.warp(50_000))
        self.assertTrue(self.store.renew(key, owner, 60_000))  # 60 s from now again
        self.store.warp(50_000)
        self.assertTrue(self.store.renew(key, owner, 60_000))
        self.assertTrue(self.store.release(key, owner))
        self.store.warp(120_000)
        self.assertFalse(self.store.release(key, owner))

    def test_wait_for_release_wakes_a_waiter_when_the_key_is_released(self) -> None:
        owner = _owner()
        self.store.acquire(self.key(), owner, 60_000)
        self._assert_release_wakes_a_waiter(lambda: self.store.release(self.key(), owner))

    def test_wait_for_release_wakes_a_waiter_when_an_operator_releases_the_key(self) -> None:
        self.store.acquire(self.key(), _owner(), 60_000)
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
        self.assertIsNotNone(self.store.acquire(self.key(), _owner(), 60_000))

    def test_wait_for_release_times_out_without_a_release(self) -> None:
        self.store.acquire(self.key(), _owner(), 60_000)
        started = time.monotonic()
        notified = self.optional(lambda: self.store.wait_for_release(self.key(), 0.3))
        self.assertFalse(notified)
        self.assertGreaterEqual(time.monotonic() - started, 0.25)

    def test_renew_many_renews_each_owned_live_lease_and_nothing_else(self) -> None:
        mine, other, gone = _owner(), _owner(), _owner()
        self.store.acquire(self.key("mine"), mine, self.short_ttl_ms)
        self.store.acquire(self.key("other"), other, 60_000)
        self.store.acquire(self.key("gone"), gone, self.short_ttl_ms)
        self.wait_until_expired(self.key("gone"), gone)
        leases = [
            (self.key("mine"), mine, 60_000),
            (self.key("other"), mine, 60_000),  # another owner's lease
            (self.key("gone"), gone, 60_000),  # expired: never revived
            (self.key("never"), mine, 60_000),
        ]
        results = self.optional(lambda: self.store.renew_many(leases))
        self.assertEqual(results, [True, False, False, False])
        self.assertEqual(self.store.renew_many([]), [])
        time.sleep(self.short_ttl_ms / 1000 * 2)  # "mine" outlives its first ttl
        self.assertIsNone(self.store.acquire(self.key("mine"), _owner(), 60_000))
        self.assertIsNotNone(self.store.acquire(self.key("gone"), _owner(), 60_000))

    def test_renew_many_of_a_thousand_leases(self) -> None:
        owner = _owner()
        keys = [self.key(f"many:{i}") for i in range(1000)]
        for key in keys:
            self.store.acquire(key, owner, 60_000)
        self.store.release(keys[7], owner)
        results = self.optional(
            lambda: self.store.renew_many([(key, owner, 60_000) for key in keys])
        )
        self.assertEqual(results.count(True), 999)
        self.assertFalse(results[7])
