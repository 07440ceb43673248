"""The etcd store's TLS and auth options on real members (tests/servers/etcd_secure.py): a member
requiring client certificates, and one with authentication on and 2 s tokens."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from django_locks import Locks
from django_locks.exceptions import StoreError
from django_locks.stores.etcd import EtcdStore
from tests.servers.etcd_secure import SecureEtcd

pytestmark = [pytest.mark.etcd, pytest.mark.slow]


@pytest.fixture(scope="module")
def tls_member() -> Iterator[SecureEtcd]:
    member = SecureEtcd(tls=True)
    yield member
    member.stop()


@pytest.fixture(scope="module")
def auth_member() -> Iterator[SecureEtcd]:
    member = SecureEtcd(auth=True, token_ttl=2)
    yield member
    member.stop()


def make_store(member: SecureEtcd, **options: Any) -> EtcdStore:
    return EtcdStore(endpoints=[member.url], prefix=f"s-{uuid.uuid4().hex[:8]}", **options)


def test_a_member_requiring_client_certificates_serves_the_store_given_them(
    tls_member: SecureEtcd,
) -> None:
    store = make_store(tls_member, **tls_member.client_options())
    with Locks(store, ttl=6).lock("k") as lock:
        assert store.acquire("k", "another", 6000) is None
        assert lock.fencing_token > 0
    assert store.acquire("k", "another", 6000) is not None
    assert [info.key for info in store.leases()] == ["k"]


def test_without_the_ca_or_with_another_cas_certificate_the_call_is_a_store_error(
    tls_member: SecureEtcd,
) -> None:
    assert tls_member.certs is not None
    options = tls_member.client_options()
    unverified = make_store(tls_member, cert=options["cert"], key=options["key"])
    with pytest.raises(StoreError, match="CERTIFICATE_VERIFY_FAILED.*Set the store's `ca_cert`"):
        unverified.acquire("k", "o", 6000, timeout=3)
    stranger = make_store(
        tls_member,
        ca_cert=options["ca_cert"],
        cert=tls_member.certs.path("stranger.pem"),
        key=tls_member.certs.path("stranger.key"),
    )
    with pytest.raises(StoreError, match="refused this client's certificate"):
        stranger.acquire("k", "o", 6000, timeout=3)
    anonymous = make_store(tls_member, ca_cert=options["ca_cert"])
    with pytest.raises(StoreError, match="requires a client certificate"):
        anonymous.acquire("k", "o", 6000, timeout=3)


def test_with_user_and_password_the_store_authenticates_and_again_when_the_token_expires(
    auth_member: SecureEtcd,
) -> None:
    store = make_store(auth_member, user="root", password=SecureEtcd.PASSWORD)
    token = store.acquire("k", "owner", 6000)
    assert token is not None
    time.sleep(3.5)  # past --auth-token-ttl 2: etcd says "invalid auth token"
    assert store.renew("k", "owner", 6000) is True
    assert store.release("k", "owner")


def test_without_credentials_or_with_a_wrong_password_the_error_says_what_to_check(
    auth_member: SecureEtcd,
) -> None:
    with pytest.raises(StoreError, match="user name is empty.*`user` and `password`"):
        make_store(auth_member).acquire("k", "o", 6000, timeout=3)
    wrong = make_store(auth_member, user="root", password="not-it")
    with pytest.raises(StoreError, match="user` and `password`"):
        wrong.acquire("k", "o", 6000, timeout=3)


@pytest.mark.parametrize(
    ("options", "rule"),
    [
        ({"cert": "/nonexistent.pem", "key": "/nonexistent.key"}, "names no file"),
        ({"ca_cert": 3}, "must be the path of a PEM file"),
        ({"user": "root"}, "`user` and `password` go together"),
        ({"user": "", "password": "x"}, "`user` must be a non-empty str"),
    ],
)
def test_bad_security_options_are_refused_naming_the_option(
    options: dict[str, Any], rule: str
) -> None:
    with pytest.raises(ValueError, match=rule):
        EtcdStore(endpoints=["https://127.0.0.1:2379"], **options)


def test_cert_without_key_is_refused(tmp_path: Any) -> None:
    pem = tmp_path / "client.pem"
    pem.write_text("x")
    with pytest.raises(ValueError, match="`cert` and `key` go together"):
        EtcdStore(endpoints=["https://127.0.0.1:2379"], cert=str(pem))


def test_bad_security_options_are_e304_naming_the_option() -> None:
    [message] = EtcdStore.check_options({"user": "root"})
    assert message.id == "django_locks.E304"
    assert "`user` and `password` go together" in message.msg
    [message] = EtcdStore.check_options({"ca_cert": "/nonexistent/ca.pem"})
    assert message.id == "django_locks.E304" and "names no file" in message.msg


def test_the_cluster_checks_go_through_tls(tls_member: SecureEtcd) -> None:
    from django.test import override_settings

    store = make_store(tls_member, **tls_member.client_options())
    with override_settings(LOCKS={"BACKEND": "django_locks.stores.EtcdStore", "TTL": "30s"}):
        found = {message.id for message in store.check(deploy=True)}
    # One member: W304 (fewer than three) only; no W301 (it answered through TLS).
    assert found == {"django_locks.W304"}, found
