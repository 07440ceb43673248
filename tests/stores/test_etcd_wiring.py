"""EtcdStore configured through ``LOCKS``, as a project sets it: built by the app's normal store
construction, checked by ``manage.py check``, listed by ``manage.py locks`` and the admin's
Leases page (which shows what etcd keeps: held leases only, no state filters, nothing to prune).
"""

from __future__ import annotations

import io
import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_locks import holders
from django_locks.service import locks
from django_locks.stores.etcd import EtcdStore

pytestmark = pytest.mark.etcd

BACKEND = "django_locks.stores.EtcdStore"
URL = "/admin/django_locks/lease/"


@pytest.fixture
def configured(etcd: Any, settings: Any) -> Iterator[EtcdStore]:
    """LOCKS names the etcd store on the suite's cluster (a prefix of its own)."""
    options = {"endpoints": etcd.endpoints, "prefix": f"wiring-{uuid.uuid4().hex[:8]}"}
    settings.LOCKS = {"BACKEND": BACKEND, "OPTIONS": {**options, "timeout": "5s"}}
    store = locks.store
    assert isinstance(store, EtcdStore)
    yield store
    store.clear()
    store.close()


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("locks", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_locks_builds_the_store_from_its_options(configured, etcd):
    assert [f"http://{host}:{port}" for _, host, port in configured.endpoints] == etcd.endpoints
    assert configured.timeout == 5.0
    assert str(configured) == "etcd " + ", ".join(url[7:] for url in etcd.endpoints)
    call_command("check", "--tag", "django_locks")  # nothing refused, no I/O


def test_an_unknown_option_is_named_with_the_stores_options(etcd):
    options = {"endpoints": etcd.endpoints, "hosts": ["x"]}
    with override_settings(LOCKS={"BACKEND": BACKEND, "OPTIONS": options}):
        with pytest.raises(SystemCheckError) as raised:
            call_command("check", "--tag", "django_locks")
    text = str(raised.value)
    assert "django_locks.E001" in text and "'hosts'" in text
    assert "its options are 'ca_cert', 'cert', 'endpoints', 'key', 'password', 'prefix'" in text


@pytest.mark.django_db
def test_locks_list_shows_the_held_leases_and_prune_has_nothing_to_do(configured):
    with locks.lock("wiring:held", ttl="30s") as held:
        out, _ = run("list", "--json")
        [lease] = json.loads(out)
        assert (lease["key"], lease["state"]) == ("wiring:held", "held")
        assert lease["fencing_token"] == held.fencing_token
        # The kind is this process's own: "process" under pytest, "command" under manage.py test.
        assert lease["holder_info"]["kind"] == holders.entry_point()[0]
        assert lease["ended"] is None
        assert 0 < lease["expires_in"] <= 30
        # etcd keeps no ended lease: --all lists the held ones.
        assert [item["key"] for item in json.loads(run("list", "--all", "--json")[0])] == [
            "wiring:held"
        ]
        table, _ = run("list")
        assert table.splitlines()[1].split()[:3] == ["wiring:held", "held", lease["holder"][:2]]
    assert run("list")[1].strip().startswith("No")  # released: gone from etcd
    out, _ = run("prune", "--older-than", "30d")
    assert out.startswith(f"Nothing to prune in {configured}")


@pytest.mark.django_db
def test_the_admin_lists_and_releases_the_held_leases_without_state_filters(
    configured, admin_client
):
    token = configured.acquire("wiring:page", "owner-1", 60_000)
    configured.acquire("wiring:gone", "owner-2", 60_000)
    configured.release("wiring:gone", "owner-2")
    html = admin_client.get(URL).content.decode()
    keys = re.findall(r'<span class="lease-key" data-key="([^"]+)"', html)
    states = re.findall(r'<span class="lease-state" data-state="([^"]+)"', html)
    assert list(zip(keys, states, strict=True)) == [("wiring:page", "held")]
    # No filter it cannot fill: etcd deletes a key as it is released or expires.
    assert 'id="changelist-filter"' not in html and "Released (" not in html
    assert f'<td class="field-fencing_token">{token}</td>' in html
    assert f"Leases of the lock store {configured}" in html
    assert "owner-1" not in html
    admin_client.post(
        URL, {"action": "release_selected", "_selected_action": ["wiring:page"], "post": "yes"}
    )
    assert configured.leases() == []
    assert LogEntry.objects.get().object_id == "wiring:page"
