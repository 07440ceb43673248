"""DatabaseStore on SQLite: its checks, and one file shared by the processes of one machine (the
contract is in test_contract.py, transactions in test_sqlite_transactions.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection
from django.test import override_settings

from django_locks.exceptions import PermitsMismatchError, StoreError
from django_locks.holders import Holder
from django_locks.stores.base import PREEMPTED, PermitGrant, Slot
from django_locks.stores.database import DatabaseStore
from django_locks.testing.holder_cases import WORKER
from tests.children.env import child_env

ROOT = Path(__file__).resolve().parents[2]


def test_sqlite_in_production_is_a_warning():
    store = DatabaseStore("default")
    assert [m.id for m in store.check()] == ["django_locks.W101"]
    with override_settings(DEBUG=True):
        assert store.check() == []


@pytest.mark.django_db
def test_check_deploy_names_transaction_mode_immediate_for_lock_atomic():
    store = DatabaseStore("default")
    options = connection.settings_dict.setdefault("OPTIONS", {})
    with override_settings(DEBUG=True):
        assert store.check() == []  # not without --deploy
        (message,) = [m for m in store.check(deploy=True) if m.id == "django_locks.W104"]
        assert "lock.atomic()" in message.msg
        assert "'transaction_mode'] = 'IMMEDIATE'" in message.hint
        try:
            for mode in ("IMMEDIATE", "immediate", "Exclusive"):  # Django takes any case
                options["transaction_mode"] = mode
                assert "django_locks.W104" not in [m.id for m in store.check(deploy=True)]
        finally:
            del options["transaction_mode"]


@pytest.mark.django_db
def test_the_schema_check_passes_on_a_migrated_sqlite_database():
    store = DatabaseStore("default")
    assert [m.id for m in store.check(databases=["default"])] == ["django_locks.W101"]


@pytest.mark.django_db(transaction=True)
def test_a_table_without_the_0003_columns_is_a_clear_error_and_a_w102():
    store = DatabaseStore("default")
    assert store.acquire("sqlite:column", "one", 60_000) is not None
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE django_locks_lease RENAME COLUMN end_reason TO away")
    try:
        with pytest.raises(StoreError, match="migrate django_locks --database default") as caught:
            store.acquire_as("sqlite:other", "two", 60_000, WORKER)
        assert "0003_holders_and_ends" in str(caught.value)
        with pytest.raises(StoreError, match="0003_holders_and_ends"):
            store.renew("sqlite:column", "one", 60_000)
        messages = [m for m in store.check(databases=["default"]) if m.id != "django_locks.W101"]
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE django_locks_lease RENAME COLUMN away TO end_reason")
    assert [m.id for m in messages] == ["django_locks.W102"]
    assert "column end_reason of django_locks_lease is missing" in messages[0].msg
    assert "migrate django_locks 0002 --fake --database default" in messages[0].hint
    assert store.renew("sqlite:column", "one", 60_000)


@pytest.mark.django_db
def test_a_failed_acquire_reads_the_holder_in_its_own_transaction():
    store = DatabaseStore("default")
    assert isinstance(store.acquire_as("sqlite:held", "one", 60_000, WORKER), int)
    found = store.acquire_as("sqlite:held", "two", 60_000, Holder(host="web-3", pid=7))
    assert isinstance(found, Holder)
    assert (found.address, found.kind, found.detail) == (WORKER.address, "worker", WORKER.detail)
    info = store.lease("sqlite:held")
    assert info is not None and info.holder_info is not None
    assert (found.since, found.expires_at) == (info.acquired_at, info.holder_info.expires_at)


@pytest.mark.slow
def test_processes_sharing_a_sqlite_file_see_one_holder_and_growing_tokens(tmp_path):
    db = str(tmp_path / "locks.sqlite3")
    result = subprocess.run(
        [sys.executable, "-m", "tests.children.sqlite_forks", db],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.stdout.strip() == "ok", result.stderr


@pytest.mark.slow
def test_processes_sharing_a_sqlite_file_hold_no_more_permits_than_the_key_has(tmp_path):
    db = str(tmp_path / "locks.sqlite3")
    result = subprocess.run(
        [sys.executable, "-m", "tests.children.sqlite_forks", db, "permits"],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.stdout.strip() == "ok", result.stderr


# 0.1.0's SQLite acquire (commit e6af6cb, django_locks/stores/database.py), which knows nothing
# of permits: SPEC section 9's rolling upgrade on one machine.
PREVIOUS_ACQUIRE = """
INSERT INTO django_locks_lease (key, owner, holder, fencing_token, acquired_at, expires_at,
    released_at)
VALUES (%s, %s, 'web-9:1', (SELECT value + 1 FROM django_locks_lease_fencing_token_seq
    WHERE id = 1), strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'),
    strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '+60.000 seconds'), NULL)
ON CONFLICT (key) DO UPDATE SET
    fencing_token = CASE WHEN owner = excluded.owner AND released_at IS NULL
        AND julianday(expires_at) > julianday('now')
        THEN fencing_token ELSE max(fencing_token + 1, excluded.fencing_token) END,
    owner = excluded.owner, holder = excluded.holder, expires_at = excluded.expires_at,
    released_at = NULL
WHERE owner = excluded.owner
    OR NOT (released_at IS NULL AND julianday(expires_at) > julianday('now'))
"""


def previous_acquire(key: str, owner: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(PREVIOUS_ACQUIRE, [key, owner])
        return bool(cursor.rowcount == 1)


@pytest.mark.django_db(transaction=True)
def test_a_previous_release_finds_a_key_held_by_permits_held_and_the_reverse():
    store = DatabaseStore("default")
    grant = store.acquire_permit("sqlite:upgrade", "one", 60_000, 3, WORKER)
    assert isinstance(grant, PermitGrant)
    assert not previous_acquire("sqlite:upgrade", "old")
    assert store.release(Slot("sqlite:upgrade", grant.permit), "one")
    assert previous_acquire("sqlite:upgrade", "old")
    with pytest.raises(PermitsMismatchError) as caught:
        store.acquire_permit("sqlite:upgrade", "two", 60_000, 3, WORKER)
    assert (caught.value.permits, caught.value.live) == (3, 1)
    info = store.lease("sqlite:upgrade")
    assert info is not None and info.owner == "old" and not info.is_summary


@pytest.mark.django_db(transaction=True)
def test_a_plain_lease_on_an_ended_slot_s_key_is_plain_and_keeps_that_slot_from_the_key():
    store = DatabaseStore("default")
    grant = store.acquire_permit("sqlite:slots", "one", 60_000, 2, WORKER)
    assert isinstance(grant, PermitGrant) and grant.permit == 1
    assert store.release(Slot("sqlite:slots", 1), "one")
    token = store.acquire("sqlite:slots#1", "plain", 60_000)
    assert token is not None and token > grant.fencing_token
    info = store.lease("sqlite:slots#1")
    assert info is not None and (info.permit, info.permits) == (None, None)
    again = store.acquire_permit("sqlite:slots", "two", 60_000, 2, WORKER)
    assert isinstance(again, PermitGrant) and again.permit == 2
    assert again.fencing_token > token
    full = store.acquire_permit("sqlite:slots", "three", 60_000, 2, WORKER)
    assert isinstance(full, Holder)  # slot 1's key is held, by a plain lease
    assert store.acquire("sqlite:slots#1", "plain", 60_000) == token  # still plain, idempotent


# 0.1.0's SQLite renew (commit e6af6cb), which knows no preempt requests.
PREVIOUS_RENEW = """
UPDATE django_locks_lease SET expires_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)
WHERE key = %s AND owner = %s AND released_at IS NULL
    AND julianday(expires_at) > julianday('now')
"""


@pytest.mark.django_db(transaction=True)
def test_a_previous_release_renews_a_lease_asked_to_give_up_and_its_new_lease_is_not_asked():
    store = DatabaseStore("default")
    assert previous_acquire("sqlite:asked", "old")
    token = store.lease("sqlite:asked")
    assert token is not None and store.preempt("sqlite:asked") == token.fencing_token
    with connection.cursor() as cursor:
        cursor.execute(PREVIOUS_RENEW, ["+60.000 seconds", "sqlite:asked", "old"])
        assert cursor.rowcount == 1  # renewed: 0.1.0 knows no requests
    assert store.renew("sqlite:asked", "old", 60_000) == PREEMPTED  # this release's answer
    assert store.release("sqlite:asked", "old")
    assert previous_acquire("sqlite:asked", "older")  # a new lease: the request left is stale
    assert store.renew("sqlite:asked", "older", 60_000) is True
