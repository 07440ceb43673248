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

import time
import unicodedata
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar

from django_locks.durations import MAX_DURATION_MS
from django_locks.stores.base import LockStore
from django_locks.testing.capabilities import OptionalCapabilityCases
from django_locks.testing.harness import WEEK_MS, new_owner
from django_locks.testing.holder_cases import HolderCases
from django_locks.testing.permit_cases import PermitCases
from django_locks.testing.preempt_cases import PreemptCases
from django_locks.testing.tick_cases import TickCases


class LockStoreContract(OptionalCapabilityCases, PreemptCases, TickCases, HolderCases, PermitCases):
    """The store contract of ``django_locks.stores.base.LockStore``, checked on ``make_store()``.

    The required rules are checked here; the optional capabilities' cases come from
    :class:`~django_locks.testing.capabilities.OptionalCapabilityCases` and
    :class:`~django_locks.testing.holder_cases.HolderCases`,
    :class:`~django_locks.testing.permit_cases.PermitCases`,
    :class:`~django_locks.testing.preempt_cases.PreemptCases` and
    :class:`~django_locks.testing.tick_cases.TickCases` and skip themselves on a store without
    the capability.
    """

    databases = "__all__"
    concurrent_callers: ClassVar[int] = 16
    """How many threads race in the concurrent cases."""
    rounds: ClassVar[int] = 5
    """How many times each race is run."""
    short_ttl_ms: ClassVar[int] = 200
    """The ttl of leases that must expire during a test: at least the store's shortest ttl,
    where it rounds shorter ones up to a minimum (etcd's cluster minimum lease ttl)."""
    ttl_granularity_ms: ClassVar[int] = 1
    """The step the store keeps ttls in, rounding a ttl up to a multiple of it, never down:
    1 for milliseconds, 1000 for a store keeping whole seconds (etcd). The cases wait for
    ``short_ttl_ms`` so rounded (or the store's ``effective_ttl_ms`` of it, when longer), plus
    ``POLL_LIMIT``, before a short lease counts as never expired, and sleep past it before they
    check that a renewed lease outlived it."""

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

    # Acquire.

    def test_acquire_free_key_returns_a_positive_int_token(self) -> None:
        token = self.store.acquire(self.key(), new_owner(), 30_000)
        self.assertIsInstance(token, int)
        assert token is not None
        self.assertGreater(token, 0)

    def test_acquire_held_key_by_another_owner_returns_none(self) -> None:
        self.assertIsNotNone(self.store.acquire(self.key(), new_owner(), 30_000))
        self.assertIsNone(self.store.acquire(self.key(), new_owner(), 30_000))

    def test_acquire_is_idempotent_for_the_same_owner(self) -> None:
        owner = new_owner()
        first = self.store.acquire(self.key(), owner, self.short_ttl_ms)
        again = self.store.acquire(self.key(), owner, 60_000)
        self.assertEqual(first, again, "a retry by the same owner must return the same token")
        # The retry extended the lease to its own ttl: it outlives the first ttl.
        time.sleep(2 * self.short_lease_life())
        self.assertIsNone(self.store.acquire(self.key(), new_owner(), 30_000))
        self.assertTrue(self.store.renew(self.key(), owner, 30_000))

    def test_keys_are_independent(self) -> None:
        self.assertIsNotNone(self.store.acquire(self.key("a"), new_owner(), 30_000))
        self.assertIsNotNone(self.store.acquire(self.key("b"), new_owner(), 30_000))

    # Renew.

    def test_renew_by_the_owner_extends_the_lease(self) -> None:
        owner = new_owner()
        self.store.acquire(self.key(), owner, self.short_ttl_ms)
        self.assertTrue(self.store.renew(self.key(), owner, 60_000))
        time.sleep(2 * self.short_lease_life())
        self.assertIsNone(self.store.acquire(self.key(), new_owner(), 30_000))
        self.assertTrue(self.store.renew(self.key(), owner, 30_000))

    def test_renew_by_another_owner_fails_and_changes_nothing(self) -> None:
        owner = new_owner()
        self.store.acquire(self.key(), owner, 30_000)
        self.assertFalse(self.store.renew(self.key(), new_owner(), 30_000))
        self.assertFalse(self.store.renew(self.key("never-taken"), owner, 30_000))
        self.assertTrue(self.store.renew(self.key(), owner, 30_000))

    # Release.

    def test_release_frees_the_key_at_once_and_keeps_the_token_floor(self) -> None:
        owner = new_owner()
        first = self.store.acquire(self.key(), owner, 30_000)
        self.assertTrue(self.store.release(self.key(), owner))
        second = self.store.acquire(self.key(), new_owner(), 30_000)
        assert first is not None and second is not None
        self.assertGreater(second, first)

    def test_release_by_another_owner_does_nothing(self) -> None:
        owner = new_owner()
        self.store.acquire(self.key(), owner, 30_000)
        self.assertFalse(self.store.release(self.key(), new_owner()))
        self.assertIsNone(self.store.acquire(self.key(), new_owner(), 30_000))
        self.assertTrue(self.store.renew(self.key(), owner, 30_000))

    def test_release_twice_returns_false_the_second_time(self) -> None:
        owner = new_owner()
        self.store.acquire(self.key(), owner, 30_000)
        self.assertTrue(self.store.release(self.key(), owner))
        self.assertFalse(self.store.release(self.key(), owner))
        self.assertFalse(self.store.renew(self.key(), owner, 30_000))

    def test_released_owner_acquiring_again_gets_a_new_token(self) -> None:
        owner = new_owner()
        first = self.store.acquire(self.key(), owner, 30_000)
        self.store.release(self.key(), owner)
        again = self.store.acquire(self.key(), owner, 30_000)
        assert first is not None and again is not None
        self.assertGreater(again, first)

    # Expiry, on the store's clock.

    def test_an_expired_lease_frees_the_key_with_a_greater_token(self) -> None:
        owner = new_owner()
        first = self.store.acquire(self.key(), owner, self.short_ttl_ms)
        deadline = self.expiry_deadline()
        second = None
        while second is None:
            self.assertLess(time.monotonic(), deadline, "the lease never expired")
            time.sleep(0.02)
            second = self.store.acquire(self.key(), new_owner(), 30_000)
        assert first is not None
        self.assertGreater(second, first)

    def test_an_expired_lease_cannot_be_renewed_or_released(self) -> None:
        owner = new_owner()
        self.store.acquire(self.key(), owner, self.short_ttl_ms)
        self.wait_until_expired(self.key(), owner)
        self.assertFalse(self.store.renew(self.key(), owner, 30_000))
        self.assertFalse(self.store.release(self.key(), owner))
        self.assertIsNotNone(self.store.acquire(self.key(), new_owner(), 30_000))

    def test_an_expired_owner_acquiring_again_gets_a_new_token(self) -> None:
        owner = new_owner()
        first = self.store.acquire(self.key(), owner, self.short_ttl_ms)
        self.wait_until_expired(self.key(), owner)
        again = self.store.acquire(self.key(), owner, 30_000)
        assert first is not None and again is not None
        self.assertGreater(again, first)

    def test_tokens_grow_across_release_and_expiry(self) -> None:
        tokens = []
        for round_ in range(6):
            owner = new_owner()
            token = self.store.acquire(self.key(), owner, self.short_ttl_ms)
            assert token is not None
            tokens.append(token)
            if round_ % 2:
                self.store.release(self.key(), owner)
            else:
                self.wait_until_expired(self.key(), owner)
        self.assertEqual(tokens, sorted(set(tokens)), "tokens must strictly increase")

    def test_week_long_ttls(self) -> None:
        owner = new_owner()
        self.assertIsNotNone(self.store.acquire(self.key(), owner, WEEK_MS))
        self.assertIsNone(self.store.acquire(self.key(), new_owner(), WEEK_MS))
        self.assertTrue(self.store.renew(self.key(), owner, 4 * WEEK_MS))
        self.assertTrue(self.store.release(self.key(), owner))

    def test_the_effective_ttl_is_never_shorter_than_the_ttl_asked_for(self) -> None:
        # What renewals and the holder's deadline use (LockStore.effective_ttl_ms): rounded up
        # where the store rounds, never down, the same for the same ttl.
        for ttl_ms in (1, 999, 1000, 1001, self.short_ttl_ms, 60_000, WEEK_MS):
            owner = new_owner()
            self.assertIsNotNone(self.store.acquire(self.key(f"e{ttl_ms}"), owner, ttl_ms))
            effective = self.store.effective_ttl_ms(ttl_ms)
            self.assertIs(type(effective), int)
            self.assertGreaterEqual(effective, ttl_ms)
            self.assertEqual(self.store.effective_ttl_ms(ttl_ms), effective)
            self.store.release(self.key(f"e{ttl_ms}"), owner)  # a 1 ms lease may be gone

    def test_a_lease_lives_its_effective_ttl_less_its_acquired_lag(self) -> None:
        # The holder's deadline counts from the send less LockStore.acquired_lag (etcd: a key
        # put on a shared lease kept alive shortly before lives until that lease's expiry):
        # the lease is still held then, by the store's own clock.
        ttl_ms = self.short_ttl_ms
        first, second = new_owner(), new_owner()
        self.assertIsNotNone(self.store.acquire(self.key("lag-a"), first, ttl_ms))
        time.sleep(ttl_ms / 1000 / 10)
        sent = time.monotonic()
        self.assertIsNotNone(self.store.acquire(self.key("lag-b"), second, ttl_ms))
        lag = self.store.acquired_lag(self.key("lag-b"), second)
        effective = self.store.effective_ttl_ms(ttl_ms) / 1000
        self.assertGreaterEqual(lag, 0)
        self.assertLessEqual(lag, effective / 3)  # at least two thirds of the ttl left
        time.sleep(max(sent + (effective - lag) * 0.9 - time.monotonic(), 0))
        self.assertIsNone(self.store.acquire(self.key("lag-b"), new_owner(), ttl_ms))
        self.store.release(self.key("lag-a"), first)
        self.store.release(self.key("lag-b"), second)

    def test_the_shortest_ttl_1_ms(self) -> None:
        owner = new_owner()
        token = self.store.acquire(self.key(), owner, 1)
        self.assertIsNotNone(token)
        deadline = self.expiry_deadline()  # a store may round 1 ms up, to short_ttl_ms at most
        while (other := self.store.acquire(self.key(), new_owner(), 1)) is None:
            self.assertLess(time.monotonic(), deadline, "a 1 ms lease never expired")
            time.sleep(0.005)
        assert token is not None
        self.assertGreater(other, token)
        self.wait_until_expired(self.key(), owner)
        self.assertFalse(self.store.renew(self.key(), owner, 1))
        self.assertFalse(self.store.release(self.key(), owner))

    def test_the_longest_ttl_366_days(self) -> None:
        owner, longest = new_owner(), MAX_DURATION_MS
        token = self.store.acquire(self.key(), owner, longest)
        self.assertIsNotNone(token)
        self.assertIsNone(self.store.acquire(self.key(), new_owner(), longest))
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
        again = self.store.acquire(self.key(), new_owner(), longest)
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
            owner = new_owner()
            self.assertIsNotNone(self.store.acquire(key, owner, 30_000), key[:10])
            self.assertIsNone(self.store.acquire(key, new_owner(), 30_000))
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
                self.store.acquire(self.key(variant), new_owner(), 30_000),
                f"{variant!r} must be a key of its own",
            )

    # Races.

    def test_exactly_one_of_many_concurrent_callers_wins(self) -> None:
        previous = 0
        for _ in range(self.rounds):
            owners = [new_owner() for _ in range(self.concurrent_callers)]
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
        holder = new_owner()
        first = self.store.acquire(self.key(), holder, self.short_ttl_ms)
        self.wait_until_expired(self.key(), holder)
        owners = [new_owner() for _ in range(self.concurrent_callers)]
        results = self.race([partial(self.store.acquire, self.key(), o, 30_000) for o in owners])
        tokens = [t for t in results if t is not None]
        self.assertEqual(len(tokens), 1)
        assert first is not None
        self.assertGreater(tokens[0], first)

    def test_concurrent_callers_on_distinct_keys_all_win_with_distinct_tokens_per_key(self) -> None:
        n = self.concurrent_callers
        results = self.race(
            [partial(self.store.acquire, self.key(f"d{i}"), new_owner(), 30_000) for i in range(n)]
        )
        self.assertTrue(all(t is not None for t in results), results)

    def test_same_owner_racing_with_itself_gets_one_token(self) -> None:
        owner = new_owner()
        results = self.race(
            [lambda: self.store.acquire(self.key(), owner, 30_000)] * self.concurrent_callers
        )
        self.assertEqual(len(set(results)), 1, results)
        self.assertIsNotNone(results[0])

    def test_release_racing_acquirers_hands_over_to_at_most_one(self) -> None:
        previous = 0
        for _ in range(self.rounds):
            holder = new_owner()
            token = self.store.acquire(self.key(), holder, 30_000)
            assert token is not None
            self.assertGreater(token, previous)
            owners = [new_owner() for _ in range(self.concurrent_callers - 1)]
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
        holder = new_owner()
        self.store.acquire(self.key(), holder, 30_000)
        calls: list[Callable[[], Any]] = [lambda: self.store.renew(self.key(), holder, 30_000)] * (
            self.concurrent_callers // 2
        )
        calls += [lambda: self.store.acquire(self.key(), new_owner(), 30_000)] * (
            self.concurrent_callers - len(calls)
        )
        results = self.race(calls)
        renewals, acquires = results[: len(results) // 2], results[len(results) // 2 :]
        self.assertTrue(all(r is True for r in renewals), renewals)
        self.assertTrue(all(a is None for a in acquires), acquires)
