"""The etcd store's system checks: its options (E301-E303, no I/O) and, with ``check --deploy``
or ``--database``, the cluster's health, version and minimum lease TTL (W301-W308).

The I/O checks ask each endpoint for its ``/v3/maintenance/status`` (all at once, each bounded
by :data:`CHECK_TIMEOUT`), one answering member for the member list, and, when a leader is
known, grant one lease of 1 s (revoked at once) to learn the cluster's minimum lease TTL. A
member down, a cluster stopped or an old etcd are warnings, never exceptions.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django.core import checks
from etcd3gw import exceptions as etcd_errors
from etcd3gw.client import Etcd3Client

from django_locks.durations import timeout_seconds
from django_locks.stores.etcd import ttl_checks
from django_locks.stores.etcd.security import OPTIONS as SECURITY_OPTIONS
from django_locks.stores.etcd.security import Security, security_problem
from django_locks.stores.etcd.ttl_checks import CHECK_TIMEOUT as CHECK_TIMEOUT
from django_locks.stores.etcd.wire import Json

if TYPE_CHECKING:
    from django_locks.stores.etcd.store import EtcdStore

MIN_VERSION = (3, 4)
"""The oldest etcd the store works with: 3.4 serves the gRPC gateway at ``/v3/``."""
MIN_MEMBERS = 3
"""The fewest voting members that survive the loss of one."""

OPTION = "LOCKS['OPTIONS']"


# Options (no I/O): EtcdStore.check_options.


def option_messages(options: dict[str, Any]) -> list[Any]:
    """E301 (``endpoints``), E302 (``prefix``), E303 (``timeout``), E304 (the TLS and auth
    options): what keeps the store from being built, each naming the option and its rule.
    Options not given take the defaults."""
    found = []
    if "endpoints" in options:
        problem = endpoints_problem(options["endpoints"])
        if problem:
            found.append(
                checks.Error(
                    problem,
                    hint=f"Set {OPTION}['endpoints'] to the client URLs of the cluster's "
                    "members, every one of them, for example ['http://etcd1:2379', "
                    "'http://etcd2:2379', 'http://etcd3:2379'].",
                    id="django_locks.E301",
                )
            )
    if "prefix" in options and prefix_problem(options["prefix"]):
        found.append(
            checks.Error(
                f"{OPTION}['prefix'] must be a non-empty str without NUL characters that "
                "encodes as UTF-8 (every key of the store lives under '<prefix>/'), got "
                f"{options['prefix']!r}.",
                hint=f"Set {OPTION}['prefix'] to a name of the project, such as "
                "'myproject-locks' (the default is 'django_locks'); projects that share a "
                "cluster need prefixes of their own.",
                id="django_locks.E302",
            )
        )
    if "timeout" in options:
        try:
            timeout_seconds(options["timeout"], name=f"{OPTION}['timeout']")
        except (TypeError, ValueError) as exc:
            found.append(
                checks.Error(
                    f"{exc}.",
                    hint=f"Set {OPTION}['timeout'] to the longest a call to etcd may take, "
                    "such as '5s' (the default: 5 seconds).",
                    id="django_locks.E303",
                )
            )
    given = {name: options.get(name) for name in SECURITY_OPTIONS}
    problem = security_problem(*given.values())
    if problem:
        found.append(
            checks.Error(
                f"{OPTION}: {problem}.",
                hint=f"Set {OPTION}['ca_cert'] to the CA bundle that signed the members' "
                "certificates, 'cert' and 'key' to this client's certificate and key (PEM "
                "paths), 'user' and 'password' to an etcd user's (docs: the etcd store's "
                "options).",
                id="django_locks.E304",
            )
        )
    return found


def endpoints_problem(value: object) -> str | None:
    """What is wrong with an ``endpoints`` option, or ``None``: a list (or tuple) of one or
    more ``http://`` / ``https://`` URLs with a host (one URL ``str`` is taken as a list of
    it, as the store does)."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple):
        return (
            f"{OPTION}['endpoints'] must be a list of the etcd members' client URLs, got "
            f"{type(value).__name__} {value!r}."
        )
    if not value:
        return f"{OPTION}['endpoints'] must list at least one etcd member's client URL, got []."
    for url in value:
        if not _is_endpoint(url):
            return (
                f"Each of {OPTION}['endpoints'] must be an http:// or https:// URL with a host "
                "and an optional port, and no path, query or user (a member's client URL, as "
                f"its --advertise-client-urls says: http://10.0.0.1:2379), got {url!r}."
            )
    return None


def _is_endpoint(url: object) -> bool:
    if not isinstance(url, str):
        return False
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError:
        return False
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        return False  # the store calls <host:port>/v3/...: a path would be dropped silently
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def prefix_problem(value: object) -> bool:
    """Whether a ``prefix`` option is refused."""
    if not isinstance(value, str) or not value or "\x00" in value:
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


# The cluster (I/O): EtcdStore.check.


@dataclasses.dataclass
class Probe:
    """What one endpoint answered: its status, or why it gave none; its etcd version."""

    endpoint: tuple[str, str, int]
    url: str
    status: Json | None = None
    failure: str | None = None
    version: str | None = None
    name: str | None = None  # the member's name, from the member list

    @property
    def who(self) -> str:
        return f"member {self.name} at {self.url}" if self.name else self.url

    @property
    def leader(self) -> str | None:
        leader = (self.status or {}).get("leader")
        return None if leader in (None, "", "0") else str(leader)


def store_messages(store: EtcdStore) -> list[Any]:
    """W301-W308 for ``store``'s cluster (``check --deploy`` / ``--database``)."""
    probes = probe_all(store.endpoints, store._process.get().wire.security)
    answering = [probe for probe in probes if probe.status is not None]
    found = [version_message(probe.who, probe.version) for probe in probes]
    found = [message for message in found if message is not None]
    if not answering:
        details = "; ".join(f"{probe.who} {probe.failure}" for probe in probes)
        return found or [
            checks.Warning(
                f"django_locks could not reach any member of the etcd cluster of {store} to "
                f"check it: {details}. The store can take, renew and release no lock.",
                hint=f"Start the members or fix {OPTION}['endpoints'], then run the check again.",
                id="django_locks.W301",
            )
        ]
    members = _members(answering[0], store._process.get().wire.security)
    _name(probes, members)
    found += _unreachable(probes, len(members) if members else None)
    found += _leaderless(answering, len(members) if members else None)
    if members is not None:
        found += _member_count(store, members)
        found += _endpoints_cover(store, members)
    if any(probe.leader for probe in answering):
        found += ttl_checks.ttl_messages(store)
    return found


def probe_all(
    endpoints: Sequence[tuple[str, str, int]], security: Security | None = None
) -> list[Probe]:
    """Every endpoint's status, asked at once (so that paused members cost one timeout)."""
    security = security or Security()
    with ThreadPoolExecutor(max_workers=len(endpoints)) as pool:
        return list(pool.map(lambda endpoint: _probe(endpoint, security), endpoints))


def _client(endpoint: tuple[str, str, int], security: Security) -> Etcd3Client:
    client = security.client(*endpoint)
    client.timeout = CHECK_TIMEOUT
    if security.ca_cert is not None:
        client.session.trust_env = False  # REQUESTS_CA_BUNDLE must not replace ca_cert
        client.session.verify = str(security.ca_cert)
    return client


def _probe(endpoint: tuple[str, str, int], security: Security) -> Probe:
    client = _client(endpoint, security)
    probe = Probe(endpoint, client.base_url)
    try:
        status: Json = client.post(client.get_url("maintenance/status"), json={})
    except etcd_errors.ConnectionTimeoutError:
        probe.failure = f"did not answer within {CHECK_TIMEOUT:g} s (stopped, paused or cut off)"
    except etcd_errors.ConnectionFailedError as exc:
        probe.failure = _connection_failure(exc)
    except (etcd_errors.Etcd3Exception, ValueError) as exc:
        text = getattr(exc, "detail_text", None) or str(exc) or type(exc).__name__
        probe.failure = f"answered /v3/maintenance/status with an error ({text.strip()[:200]})"
        if "404" in str(exc) or "Not Found" in f"{text} {exc}":
            probe.failure += (
                ": this looks like a member's peer URL (--listen-peer-urls, 2380 by default); "
                "list the client URLs (--advertise-client-urls, 2379 by default)"
            )
        probe.version = _version(client)
    else:
        probe.status = status
        probe.version = str(status.get("version") or "") or None
    finally:
        client.session.close()
    return probe


def _connection_failure(exc: BaseException) -> str:
    """Why a connection to an endpoint failed, as the check says it."""
    text = f"{exc} {exc.__context__}"
    if (
        "NameResolutionError" in text
        or "Name or service not known" in text
        or ("name resolution" in text)
    ):
        return "could not be connected to: its host name does not resolve (DNS)"
    if "SSL" in text:
        return f"could not be connected to: the TLS handshake failed ({text.strip()[:160]})"
    return "could not be connected to (not running, or not at this address)"


def _version(client: Etcd3Client) -> str | None:
    """``etcdserver`` of ``GET /version`` (every etcd has it, 3.3 included), or ``None``."""
    try:
        response = client.session.get(client.base_url + "/version", timeout=CHECK_TIMEOUT)
        return str(response.json()["etcdserver"])
    except Exception:  # not etcd, or not answering: no version to report
        return None


def version_message(who: str, version: str | None) -> Any | None:
    """W306 when ``version`` is below :data:`MIN_VERSION` (``None``: unknown, nothing said)."""
    match = re.match(r"v?(\d+)\.(\d+)", version or "")
    if match is None or (int(match.group(1)), int(match.group(2))) >= MIN_VERSION:
        return None
    return checks.Warning(
        f"etcd at {who} runs etcd {version}: EtcdStore needs etcd 3.4 or later (it calls the "
        "gRPC gateway at /v3/, which etcd 3.4 introduced, and takes locks in nested "
        "transactions); its calls to this member fail.",
        hint="Upgrade the members to etcd 3.4 or later, one at a time as etcd's upgrade guide "
        "says (Debian's etcd-server package is 3.4).",
        id="django_locks.W306",
    )


def _members(probe: Probe, security: Security) -> list[Json] | None:
    """The voting members (learners left out), asked of an answering endpoint."""
    client = _client(probe.endpoint, security)
    try:
        reply: Json = client.post(client.get_url("cluster/member/list"), json={})
    except (etcd_errors.Etcd3Exception, ValueError):
        return None
    finally:
        client.session.close()
    return [member for member in reply.get("members", ()) if not member.get("isLearner")]


def _key(url: str) -> tuple[str, str, int]:
    """A URL as the store reads an endpoint: (scheme, host, port, 2379 if none)."""
    try:
        parts = urlsplit(url)
        return parts.scheme, (parts.hostname or "").lower(), parts.port or 2379
    except ValueError:
        return "", url, 0


def _name(probes: list[Probe], members: list[Json] | None) -> None:
    for member in members or ():
        urls = {_key(url) for url in member.get("clientURLs", ())}
        for probe in probes:
            protocol, host, port = probe.endpoint
            if (protocol, host.lower(), port) in urls:
                probe.name = member.get("name") or None


def _unreachable(probes: list[Probe], members: int | None) -> list[Any]:
    down = [probe for probe in probes if probe.status is None]
    if not down:
        return []
    said = "; ".join(f"{probe.who} {probe.failure}" for probe in down)
    total = max(members or len(probes), len(probes))
    majority = total // 2 + 1
    spare = total - len(down) - majority
    if spare > 0:
        then = f"{spare} more of them may stop before it does"
    else:
        then = (
            "one more member lost and no lock can be taken, renewed or released (held ones "
            "are lost at their holders' deadlines)"
        )
    return [
        checks.Warning(
            f"{len(down)} of the {len(probes)} etcd endpoints of the lock store did not answer: "
            f"{said}. The store goes on through the other members while a majority "
            f"({majority} of {total}) answers: {then}.",
            hint="Start the member again (or replace it: etcdctl member remove, then member "
            f"add), or take its URL out of {OPTION}['endpoints'] if it left the cluster.",
            id="django_locks.W302",
        )
    ]


def _leaderless(answering: list[Probe], members: int | None) -> list[Any]:
    lost = [probe for probe in answering if probe.leader is None]
    if not lost:
        return []
    errors = sorted({str(e) for probe in lost for e in (probe.status or {}).get("errors", ())})
    why = f" ({'; '.join(errors)})" if errors else ""
    names = ", ".join(probe.who for probe in lost)
    if len(lost) == len(answering):
        of = f" of its {members}" if members else ""
        what = (
            f"The etcd cluster has no leader: {names} report none{why}. The lock store can "
            f"take, renew and release no lock until a majority{of} members is up and has "
            "elected one; held locks lapse at their ttl."
        )
    else:
        what = (
            f"{names} report no leader{why} while the other members follow one: cut off from "
            "the majority, they fail every call the lock store sends them."
        )
    return [
        checks.Warning(
            what,
            hint="Bring back a majority of the members (start the stopped ones, mend the "
            "network between them); their logs tell of the elections.",
            id="django_locks.W303",
        )
    ]


def _member_count(store: EtcdStore, members: list[Json]) -> list[Any]:
    if len(members) >= MIN_MEMBERS:
        return []
    count = f"{len(members)} voting member{'s' * (len(members) != 1)}"
    majority = " (a majority of 2 is 2)" if len(members) == 2 else ""
    return [
        checks.Warning(
            f"The etcd cluster of {store} has {count}: the loss of one member (a crash, a "
            f"restart to upgrade it){majority} stops the lock store until it is back.",
            hint=f"Run {MIN_MEMBERS} members (5 survive the loss of two) on separate machines: "
            f"add them with `etcdctl member add` and list each in {OPTION}['endpoints'].",
            id="django_locks.W304",
        )
    ]


def _endpoints_cover(store: EtcdStore, members: list[Json]) -> list[Any]:
    """W305: the endpoints name some members, not all (a proxy or DNS name in front of every
    member names none of them: nothing is said then)."""
    configured = {(protocol, host.lower(), port) for protocol, host, port in store.endpoints}
    listed = [member for member in members if member.get("clientURLs")]
    named = [m for m in listed if configured & {_key(url) for url in m["clientURLs"]}]
    missing = [m for m in listed if m not in named]
    if not named or not missing:
        return []
    urls = [member["clientURLs"][0] for member in missing]
    names = ", ".join(f"{m.get('name') or m.get('ID')} ({m['clientURLs'][0]})" for m in missing)
    return [
        checks.Warning(
            f"{OPTION}['endpoints'] lists {len(named)} of the {len(listed)} members of the etcd "
            f"cluster, not {names}: when the members it lists fail, the lock store cannot "
            "reach the cluster although the others still serve it.",
            hint=f"Add {', '.join(map(repr, urls))} to {OPTION}['endpoints'] (silence "
            "django_locks.W305 if an endpoint is a proxy in front of every member).",
            id="django_locks.W305",
        )
    ]
