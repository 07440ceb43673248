"""The calls of ``EtcdStore``: etcd's v3 JSON API on the gRPC gateway, through etcd3gw's client.

One :class:`etcd3gw.client.Etcd3Client` per endpoint and thread (each has its ``requests``
session; a call sets its own timeout on it), made afresh in a forked child. A call goes to the
endpoint that answered last; an endpoint that refuses the connection is left for the next one
at once (nothing was sent). A call that times out may have been applied: it raises
``StoreTimeoutError`` and the next call starts at the next endpoint (the caller decides whether
to retry; acquire and renew are idempotent). etcd's own errors ("etcdserver: leader changed",
"requested lease not found") are ``StoreError`` naming the endpoint, except the lease one, which
the store handles (:class:`LeaseNotFound`).
"""

from __future__ import annotations

import base64
import re
import ssl
import threading
import time
from collections.abc import Sequence
from typing import Any

import requests
import urllib3
from etcd3gw import exceptions as etcd_errors
from etcd3gw.client import Etcd3Client

from django_locks.durations import MAX_DURATION_MS
from django_locks.exceptions import StoreError, StoreTimeoutError
from django_locks.policy import POLICY
from django_locks.stores.etcd.security import Security

Json = dict[str, Any]


class LeaseNotFound(StoreError):
    """etcd answered "requested lease not found": the lease a put named has expired."""


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def range_end(prefix: bytes) -> bytes:
    """The end of the range of every key starting with ``prefix`` (its last byte incremented)."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


# Txn operations (etcdserverpb's RequestOp / Compare, as the gateway's JSON spells them).


def put(key: bytes, value: bytes, lease: int = 0) -> Json:
    return {"request_put": {"key": b64(key), "value": b64(value), "lease": str(lease)}}


def move(key: bytes, lease: int) -> Json:
    """Put ``key`` onto ``lease`` keeping its value (and its create_revision: the token)."""
    return {"request_put": {"key": b64(key), "ignore_value": True, "lease": str(lease)}}


def get(key: bytes) -> Json:
    return {"request_range": {"key": b64(key)}}


def get_prefix(prefix: bytes, *, limit: int = 0) -> Json:
    body = {"key": b64(prefix), "range_end": b64(range_end(prefix)), "limit": str(limit)}
    return {"request_range": body}


def delete(key: bytes) -> Json:
    return {"request_delete_range": {"key": b64(key)}}


def txn(compare: Sequence[Json], success: Sequence[Json], failure: Sequence[Json] = ()) -> Json:
    return {"request_txn": {"compare": list(compare), "success": list(success),
                            "failure": list(failure)}}  # fmt: skip


def absent(key: bytes) -> Json:
    return {"target": "CREATE", "key": b64(key), "create_revision": "0", "result": "EQUAL"}


def created_at(key: bytes, revision: int) -> Json:
    return {"target": "CREATE", "key": b64(key), "create_revision": str(revision),
            "result": "EQUAL"}  # fmt: skip


def on_lease(key: bytes, lease: int) -> Json:
    return {"target": "LEASE", "key": b64(key), "lease": str(lease), "result": "EQUAL"}


def owned_by(key: bytes, owner_prefix: bytes) -> list[Json]:
    """The key's value starts with ``owner_prefix`` (``owner + NUL``): two comparisons of the
    whole value, since etcd compares values only whole (``prefix <= value < prefix+1``)."""
    upper = owner_prefix[:-1] + b"\x01"
    return [
        {"target": "VALUE", "key": b64(key), "value": b64(owner_prefix), "result": "GREATER"},
        {"target": "VALUE", "key": b64(key), "value": b64(upper), "result": "LESS"},
    ]


def responses(reply: Json) -> list[Json]:
    """A Txn reply's responses, nested Txns' unwrapped in order (``[(succeeded, [...]), ...]``
    are left to the caller: this returns the top level)."""
    return list(reply.get("responses", ()))


def kvs(response: Json) -> list[Json]:
    """The key-values of one ``response_range`` (empty when the range found none)."""
    return list(response.get("response_range", {}).get("kvs", ()))


class Wire:
    """The endpoints of one store, for this process: one client per endpoint and thread."""

    def __init__(
        self, endpoints: Sequence[tuple[str, str, int]], what: str, security: Security
    ) -> None:
        self.endpoints = list(endpoints)
        self.what = what
        self.security = security
        self._local = threading.local()
        self.preferred = 0  # the endpoint that answered last
        self._lock = threading.Lock()
        self._token: str | None = None  # etcd's auth token, shared by this process's threads

    def client(self, index: int) -> Etcd3Client:
        clients: dict[int, Etcd3Client] | None = getattr(self._local, "clients", None)
        if clients is None:
            clients = self._local.clients = {}
        client = clients.get(index)
        if client is None:
            client = clients[index] = self.security.client(*self.endpoints[index])
        return client

    def authorize(self, client: Etcd3Client, timeout: float, *, afresh: bool = False) -> None:
        """With ``user``: put this process's etcd auth token on ``client``'s session, asking
        etcd for one first (``auth/authenticate``) when there is none yet or ``afresh``."""
        if self.security.user is None:
            return
        with self._lock:
            token = None if afresh else self._token
        if token is None:
            client.session.headers.pop("Authorization", None)
            body = {"name": self.security.user, "password": self.security.password or ""}
            client.timeout = timeout
            url = client.get_url("auth/authenticate")
            token = str(client.post(url, json=body, **self.security.per_request)["token"])
            with self._lock:
                self._token = token
        client.session.headers["Authorization"] = token

    def close(self) -> None:
        """Close the calling thread's sessions (other threads' close as they end)."""
        clients: dict[int, Etcd3Client] = getattr(self._local, "clients", {})
        for client in clients.values():
            client.session.close()
        clients.clear()

    def endpoint(self, index: int) -> str:
        protocol, host, port = self.endpoints[index]
        return f"{protocol}://{host}:{port}"

    @staticmethod
    def deadline(timeout: float) -> float:
        return time.monotonic() + min(timeout, MAX_DURATION_MS / 1000)

    def call(self, path: str, body: Json, deadline: float, *, again: bool = False) -> Json:
        """POST ``body`` to ``path`` (``"kv/txn"``, ``"lease/keepalive"``) on one endpoint,
        moving on to the next when one refuses the connection; ``StoreTimeoutError`` at the
        deadline. ``again``: the call may be applied twice (it is idempotent), so one that
        failed or went unanswered for ``POLICY.etcd_attempt`` is sent again to the next
        endpoint, until the deadline (a member without a leader holds a write for 7 s)."""
        count = len(self.endpoints)
        index = self.preferred
        refused = 0  # endpoints in a row that refused the connection
        last_error: etcd_errors.Etcd3Exception | None = None
        failed: StoreTimeoutError | None = None
        while refused < count:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            budget = min(left, POLICY.etcd_attempt) if again else left
            try:
                reply = self._once(index, path, body, budget)
            except _Refused as refusal:
                last_error = refusal.error  # nothing was sent: the next endpoint, at once
                refused += 1
                index = (index + 1) % count
                continue
            except StoreTimeoutError as exc:
                index = (index + 1) % count
                self._prefer(index)
                if not again:
                    raise
                failed, refused = exc, 0
                time.sleep(min(POLICY.etcd_attempt / 20, self._left(deadline)))
                continue
            self._prefer(index)
            return reply
        if failed is not None:
            raise failed
        if last_error is None:
            raise StoreTimeoutError(f"{self.what} was not called: the call's time ran out")
        raise StoreError(
            f"No endpoint of {self.what} accepted a connection ({_said(last_error)}): check "
            f"that the etcd members are running and reachable, and the store's `endpoints`."
        ) from last_error

    @staticmethod
    def _left(deadline: float) -> float:
        return max(deadline - time.monotonic(), 0)

    def _once(self, index: int, path: str, body: Json, budget: float) -> Json:
        """One POST to the endpoint ``index`` within ``budget`` seconds: ``_Refused`` when the
        connection could not be made, ``StoreTimeoutError`` when the call may have been
        applied."""
        client = self.client(index)
        per_request = self.security.per_request
        try:
            self.authorize(client, budget)
            client.timeout = budget
            try:
                reply: Json = client.post(client.get_url(path), json=body, **per_request)
            except etcd_errors.Etcd3Exception as exc:
                if "invalid auth token" not in f"{exc.detail_text or ''} {exc}":
                    raise
                self.authorize(client, budget, afresh=True)  # it expired: once more
                reply = client.post(client.get_url(path), json=body, **per_request)
        except etcd_errors.ConnectionFailedError as exc:
            tls = _tls_failure(exc)
            if tls is not None:  # the handshake failed: nothing was sent
                where, hint = self.endpoint(index), _tls_hint(tls, self.security.cert is not None)
                raise StoreError(
                    f"The TLS handshake with etcd at {where} failed ({tls}).{hint}"
                ) from exc
            if _not_sent(exc):
                raise _Refused(exc) from exc
            # A 503 ("etcdserver: request timed out" after a leader change: a write through a
            # follower waits 7 s, then says nothing of whether it landed) or a connection lost
            # after sending: the call may have been applied, as after a timeout.
            raise StoreTimeoutError(
                f"etcd at {self.endpoint(index)} failed the call ({_said(exc)}); it may have "
                f"been applied, and the next call goes to another endpoint of {self.what}."
                f"{_hint(_said(exc))}"
            ) from exc
        except etcd_errors.ConnectionTimeoutError as exc:
            raise StoreTimeoutError(
                f"etcd at {self.endpoint(index)} did not answer within {budget:.3g}s; the call "
                f"was abandoned (it may have been applied) and the next call goes to another "
                f"endpoint of {self.what}."
            ) from exc
        except etcd_errors.Etcd3Exception as exc:
            text = f"{exc.detail_text or ''} {exc}"
            if "requested lease not found" in text:
                raise LeaseNotFound(f"{self.what}: the lease has expired") from exc
            if _electing(text):  # "leader changed": the outcome is not known
                raise StoreTimeoutError(
                    f"etcd at {self.endpoint(index)} failed the call ({_said(exc)}); it may "
                    f"have been applied.{_hint(text)}"
                ) from exc
            said = _said(exc).rstrip(".")
            raise StoreError(
                f"etcd at {self.endpoint(index)} failed a lock store call: {said}.{_hint(text)}"
            ) from exc
        return reply

    def _prefer(self, index: int) -> None:
        with self._lock:
            self.preferred = index


class _Refused(Exception):
    """The connection to an endpoint could not be made: nothing was sent."""

    def __init__(self, error: etcd_errors.Etcd3Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _not_sent(exc: BaseException) -> bool:
    """Whether the connection could not be made at all (nothing reached etcd): etcd3gw raises
    ``ConnectionFailedError`` for that, for a connection lost later and for an HTTP 503."""
    seen: set[int] = set()
    causes: list[object] = [exc.__context__]
    while causes:
        cause = causes.pop()
        # A chain of exceptions; urllib3's ``reason`` may be an exception or a str (an SSL
        # error's), which ends that branch.
        if not isinstance(cause, BaseException) or id(cause) in seen:
            continue
        seen.add(id(cause))
        if isinstance(cause, urllib3.exceptions.NewConnectionError):
            return True
        causes += [cause.__context__, cause.__cause__, getattr(cause, "reason", None)]
    return "Failed to establish a new connection" in str(exc)


def _tls_failure(exc: BaseException) -> str | None:
    """The TLS error under ``exc`` (its reason, as OpenSSL words it), or ``None``."""
    cause: BaseException | None = exc.__context__
    for _ in range(8):
        if cause is None:
            return None
        if isinstance(cause, ssl.SSLError):
            return str(cause.reason or cause)
        if isinstance(cause, requests.exceptions.SSLError):
            reason = re.search(r"\[SSL: ([A-Z0-9_]+)\]|(EOF occurred[^(']*)", str(cause))
            found = next((g for g in reason.groups() if g), None) if reason else None
            return (found or str(cause)).strip()
        cause = cause.__cause__ or cause.__context__
    return None


def _tls_hint(reason: str, with_cert: bool) -> str:
    if "VERIFY_FAILED" in reason or "verify failed" in reason:
        return (
            " Set the store's `ca_cert` to the CA bundle that signed the members' certificates "
            "(their --trusted-ca-file's CA, or whichever signed --cert-file)."
        )
    if "WRONG_VERSION_NUMBER" in reason:
        return " The member answers plain http on this port: list it as http://."
    if with_cert:
        return (
            " The member refused this client's certificate: set `cert` and `key` to one "
            "signed by its --trusted-ca-file."
        )
    return (
        " The member ended the handshake: it serves plain http on this port (list it as "
        "http://), or it requires a client certificate (--client-cert-auth: set `cert` and "
        "`key`)."
    )


def _said(exc: etcd_errors.Etcd3Exception) -> str:
    return " ".join(str(part) for part in (exc.detail_text, *exc.args[1:]) if part).strip()


def _electing(text: str) -> bool:
    return "leader changed" in text or "no leader" in text or "timed out" in text


def _hint(text: str) -> str:
    if "authentication failed" in text or "user name is empty" in text:
        return " Check the store's `user` and `password` (etcdctl user get USER)."
    if "permission denied" in text:
        return (
            " Grant the store's etcd user read and write on its prefix (etcdctl role "
            "grant-permission ROLE --prefix=true readwrite PREFIX/)."
        )
    if _electing(text):
        return " The cluster is electing a leader: the call can be retried in a moment."
    if "too many operations in txn" in text:
        return " Raise the members' --max-txn-ops (128 by default), or use fewer permits."
    return ""
