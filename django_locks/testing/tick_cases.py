"""The store contract's cases for tick records (``LockStore.supports_ticks``, SPEC sections 4 and
12: what beat writes before it publishes a tick of an ``on_one_instance(catch_up=True)`` entry).

Each case skips itself, with the reason, on a store that does not record ticks (one checks that
such a store refuses ``record_tick()`` and ``recorded_tick()`` with ``NotImplementedError``).
``LockStoreContract`` includes them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

from django_locks.stores.base import PERMITS_OWNER, Slot, TickRecord
from django_locks.stores.ticks import MAX_TICK_MS
from django_locks.testing.harness import POLL_LIMIT, new_owner
from django_locks.testing.holder_cases import WORKER
from django_locks.testing.permit_operation_cases import PermitOperationCases

TICK = 1_767_225_600_000
"""A tick's scheduled time: 2026-01-01 00:00 UTC, in milliseconds since the Unix epoch."""
MINUTE = 60_000


class TickCases(PermitOperationCases):
    """What a store that records ticks writes, refuses, keeps and clears."""

    __test__ = False

    def ticking(self) -> None:
        if not self.store.supports_ticks:
            self.skipTest(f"{type(self.store).__name__} does not record ticks")

    def recorded(self, key: str) -> TickRecord | None:
        """The tick record of ``key``, checked to be a ``TickRecord`` of two ``int``."""
        record = self.store.recorded_tick(key)
        if record is not None:
            self.assertIsInstance(record, TickRecord)
            self.assertEqual((type(record.tick_ms), type(record.fencing_token)), (int, int))
        return record

    def test_a_store_without_tick_records_refuses_them(self) -> None:
        if self.store.supports_ticks:
            self.skipTest(f"{type(self.store).__name__} offers tick records")
        owner = new_owner()
        self.store.acquire(self.key(), owner, 60_000)
        with self.assertRaises(NotImplementedError):
            self.store.record_tick(self.key(), owner, TICK)
        with self.assertRaises(NotImplementedError):
            self.store.recorded_tick(self.key())
        self.assertIs(self.store.renew(self.key(), owner, 60_000), True)

    # Written by the holder.

    def test_the_holder_records_a_tick_read_back_with_its_lease_s_token(self) -> None:
        self.ticking()
        self.assertIs(type(self.store).supports_ticks, True, "a class attribute")
        key, owner = self.key(), new_owner()
        token = self.store.acquire(key, owner, 60_000)
        assert token is not None
        self.assertIsNone(self.recorded(key), "held, never recorded")
        self.assertIs(self.store.record_tick(key, owner, TICK), True)
        self.assertEqual(self.recorded(key), TickRecord(TICK, token))
        # Each write replaces the record, an earlier tick too: the caller decides.
        self.assertIs(self.store.record_tick(key, owner, TICK - MINUTE), True)
        self.assertEqual(self.recorded(key), (TICK - MINUTE, token))
        for extreme in (0, MAX_TICK_MS):
            self.assertIs(self.store.record_tick(key, owner, extreme), True, extreme)
            self.assertEqual(self.recorded(key), (extreme, token))
        # The lease is as it was; the same owner's idempotent acquire keeps it, and writes on.
        self.assertIsNone(self.store.acquire(key, new_owner(), 60_000), "still held")
        self.assertEqual(self.store.acquire(key, owner, 60_000), token)
        self.assertIs(self.store.record_tick(key, owner, TICK), True)
        self.assertEqual(self.recorded(key), (TICK, token))
        self.assertIs(self.store.renew(key, owner, 60_000), True)
        # Keys are independent.
        self.store.acquire(self.key("other"), owner, 60_000)
        self.assertIsNone(self.recorded(self.key("other")))

    def test_a_key_never_recorded_has_no_tick_record(self) -> None:
        self.ticking()
        released = new_owner()
        self.store.acquire(self.key("released"), released, 60_000)
        self.store.release(self.key("released"), released)
        self.store.acquire(self.key("held"), new_owner(), 60_000)
        for name in ("never", "released", "held"):
            self.assertIsNone(self.recorded(self.key(name)), name)

    # Refused: nothing written.

    def test_only_the_live_lease_s_owner_records_a_tick_and_a_refusal_writes_none(self) -> None:
        self.ticking()
        holder, released, expired = new_owner(), new_owner(), new_owner()
        held = self.store.acquire(self.key("held"), holder, 60_000)
        self.assertTrue(self.store.record_tick(self.key("held"), holder, TICK))
        gone = self.store.acquire(self.key("released"), released, 60_000)
        self.assertTrue(self.store.record_tick(self.key("released"), released, TICK))
        self.assertTrue(self.store.release(self.key("released"), released))
        self.store.acquire(self.key("expired"), expired, self.short_ttl_ms)
        self.wait_until_expired(self.key("expired"), expired)
        refused = [
            ("held", new_owner()),  # another owner
            ("released", released),
            ("expired", expired),
            ("never", holder),  # a key nobody took
        ]
        for name, owner in refused:
            answer = self.store.record_tick(self.key(name), owner, TICK + MINUTE)
            self.assertIs(answer, False, name)
        self.assertEqual(self.recorded(self.key("held")), (TICK, held))
        self.assertEqual(self.recorded(self.key("released")), (TICK, gone))
        self.assertIsNone(self.recorded(self.key("expired")))
        self.assertIsNone(self.recorded(self.key("never")))
        self.assertIs(self.store.renew(self.key("held"), holder, 60_000), True)

    def test_a_bad_tick_ms_is_refused_naming_it_before_any_io(self) -> None:
        self.ticking()
        key, owner = self.key(), new_owner()
        token = self.store.acquire(key, owner, 60_000)
        self.store.record_tick(key, owner, TICK)
        bad: list[Any] = [-1, True, False, 1.5, float(TICK), "1767225600000", None, MAX_TICK_MS + 1]
        for value in bad:
            for name in ("k", "never"):  # a key nobody holds too: refused before it is read
                with self.assertRaises(ValueError, msg=repr(value)) as caught:
                    self.store.record_tick(self.key(name), owner, value)
                self.assertIn("tick_ms", str(caught.exception))
        self.assertEqual(self.recorded(key), (TICK, token), "nothing written")
        self.assertIsNone(self.recorded(self.key("never")))

    def test_a_key_held_by_permits_records_no_tick(self) -> None:
        self.ticking()
        self.permitting()
        key, plain = self.key(), new_owner()
        token = self.store.acquire(key, plain, 60_000)
        self.assertTrue(self.store.record_tick(key, plain, TICK))
        self.assertTrue(self.store.release(key, plain))
        owner = new_owner()
        grant = self.grant(key, owner, 2)
        self.assertEqual(self.recorded(key), (TICK, token), "a permit's acquire keeps it")
        slot = Slot(key, grant.permit)
        for name, owner_of in ((key, owner), (slot, owner), (key, PERMITS_OWNER)):
            answer = self.store.record_tick(name, owner_of, TICK + MINUTE)
            self.assertIs(answer, False, (str(name), owner_of))
        self.assertEqual(self.recorded(key), (TICK, token))
        self.assertIsNone(self.recorded(slot))
        fresh = self.key("fresh")
        slot = Slot(fresh, self.grant(fresh, owner, 3).permit)
        self.assertIs(self.store.record_tick(slot, owner, TICK), False)
        self.assertIs(self.store.record_tick(fresh, owner, TICK), False)
        self.assertIsNone(self.recorded(fresh))
        self.assertIsNone(self.recorded(slot))
        self.assertIs(self.store.renew(slot, owner, 60_000), True)

    # Kept: the beat that takes the key over reads it after its own acquire.

    def test_a_tick_record_survives_expiry_release_and_other_owners_acquires(self) -> None:
        self.ticking()
        key, first, second, third = self.key(), new_owner(), new_owner(), new_owner()
        token = self.store.acquire(key, first, self.short_ttl_ms)
        assert token is not None
        self.assertTrue(self.store.record_tick(key, first, TICK))
        self.wait_until_expired(key, first)
        self.assertEqual(self.recorded(key), (TICK, token), "the lease expired")
        taken = self.store.acquire_as(key, second, 60_000, WORKER)
        assert isinstance(taken, int)
        self.assertGreater(taken, token)
        self.assertEqual(self.recorded(key), (TICK, token), "another owner's acquire keeps it")
        self.assertIs(self.store.record_tick(key, first, TICK + MINUTE), False, "it expired")
        self.assertTrue(self.store.record_tick(key, second, TICK + MINUTE))
        self.assertEqual(self.recorded(key), (TICK + MINUTE, taken), "replaced, its token")
        self.assertTrue(self.store.release(key, second))
        self.assertEqual(self.recorded(key), (TICK + MINUTE, taken), "the lease was released")
        newest = self.store.acquire(key, third, 60_000)
        assert newest is not None
        self.assertEqual(self.recorded(key), (TICK + MINUTE, taken))
        self.assertTrue(self.store.record_tick(key, third, TICK + 2 * MINUTE))
        self.assertEqual(self.recorded(key), (TICK + 2 * MINUTE, newest))

    # Removed.

    def test_clear_removes_every_tick_record(self) -> None:
        self.ticking()
        held, released = new_owner(), new_owner()
        self.store.acquire(self.key("held"), held, 60_000)
        self.store.record_tick(self.key("held"), held, TICK)
        self.store.acquire(self.key("released"), released, 60_000)
        self.store.record_tick(self.key("released"), released, TICK)
        self.store.release(self.key("released"), released)
        self.optional(self.store.clear)
        for name in ("held", "released"):
            self.assertIsNone(self.recorded(self.key(name)), name)
        owner = new_owner()
        token = self.store.acquire(self.key("held"), owner, 60_000)
        self.assertTrue(self.store.record_tick(self.key("held"), owner, TICK + MINUTE))
        self.assertEqual(self.recorded(self.key("held")), (TICK + MINUTE, token))

    def test_a_pruned_key_s_tick_record_goes_with_it(self) -> None:
        self.ticking()
        if not self.store.keeps_ended_leases:
            self.skipTest(f"{type(self.store).__name__} keeps no ended leases")
        key, owner, held = self.key(), new_owner(), new_owner()
        self.store.acquire(key, owner, 60_000)
        self.store.record_tick(key, owner, TICK)
        self.store.release(key, owner)
        self.store.acquire(self.key("held"), held, 60_000)
        self.store.record_tick(self.key("held"), held, TICK)
        self.optional(lambda: self.store.prune(0, dry_run=True))
        deadline = time.monotonic() + POLL_LIMIT
        self.store.prune(0)
        while self.recorded(key) is not None:
            # Ended "now": older than 0 ms once the store's clock moved on (SQLite's: 1 ms).
            self.assertLess(time.monotonic(), deadline, "the ended lease's row was never pruned")
            time.sleep(0.01)
            self.store.prune(0)
        self.assertIsNotNone(self.recorded(self.key("held")), "a live lease is never pruned")

    # Races.

    def test_of_many_concurrent_tick_writers_only_the_holder_s_writes_land(self) -> None:
        self.ticking()
        key, previous = self.key(), new_owner()
        self.store.acquire(key, previous, 60_000)
        self.store.release(key, previous)
        writers = max(1, self.concurrent_callers // 2)
        for round_ in range(self.rounds):
            holder = new_owner()
            token = self.store.acquire(key, holder, 60_000)
            ours = [TICK + round_ * MINUTE + n for n in range(writers)]
            theirs = [new_owner() for _ in range(self.concurrent_callers - writers - 1)]
            calls: list[Callable[[], Any]] = [
                partial(self.store.record_tick, key, holder, tick) for tick in ours
            ]
            calls += [partial(self.store.record_tick, key, o, TICK - 1) for o in theirs]
            calls.append(partial(self.store.record_tick, key, previous, TICK - 2))
            results = self.race(calls)
            self.assertEqual(results[:writers], [True] * writers, "the holder's writes")
            self.assertEqual(results[writers:], [False] * (len(calls) - writers), "the others'")
            record = self.recorded(key)
            assert record is not None
            self.assertEqual(record.fencing_token, token)
            self.assertIn(record.tick_ms, ours)
            self.assertTrue(self.store.release(key, holder))
            previous = holder
