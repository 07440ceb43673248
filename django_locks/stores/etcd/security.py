"""The TLS and auth options of ``EtcdStore``: checked without I/O, then given to each client."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from etcd3gw.client import Etcd3Client

OPTIONS = ("ca_cert", "cert", "key", "user", "password")


@dataclasses.dataclass(frozen=True)
class Security:
    """The store's TLS and auth options: ``ca_cert`` (the CA bundle that signed the members'
    certificates), ``cert`` and ``key`` (this client's certificate and its key), ``user`` and
    ``password`` (etcd's authentication: a token asked for once, again when etcd says it is
    invalid)."""

    ca_cert: str | None = None
    cert: str | None = None
    key: str | None = None
    user: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)

    @property
    def per_request(self) -> dict[str, Any]:
        """Given to each request: ``requests`` lets ``REQUESTS_CA_BUNDLE`` (set on many hosts)
        override a session's ``verify``, not a request's."""
        return {} if self.ca_cert is None else {"verify": os.fspath(self.ca_cert)}

    def client(self, protocol: str, host: str, port: int) -> Etcd3Client:
        # /v3/ is etcd 3.4's gateway path: no discovery round trip (the check reads the version).
        return Etcd3Client(
            host=host,
            port=port,
            protocol=protocol,
            api_path="/v3/",
            ca_cert=self.ca_cert,
            cert_cert=self.cert,
            cert_key=self.key,
        )


def security_problem(
    ca_cert: object, cert: object, key: object, user: object, password: object
) -> str | None:
    """What is wrong with the TLS and auth options (``None``: nothing), without I/O but for
    whether the files exist."""
    for name, value in (("ca_cert", ca_cert), ("cert", cert), ("key", key)):
        if value is None:
            continue
        if not isinstance(value, (str, os.PathLike)) or not str(value):
            return f"`{name}` must be the path of a PEM file, got {value!r}"
        if not os.path.isfile(value):
            return f"`{name}` names no file: {os.fspath(value)!r} (a PEM file's path)"
    if (cert is None) != (key is None):
        return "`cert` and `key` go together: the client certificate and its private key"
    for name, value in (("user", user), ("password", password)):
        if value is not None and (not isinstance(value, str) or not value):
            return f"`{name}` must be a non-empty str, got {value!r}"
    if (user is None) != (password is None):
        return "`user` and `password` go together (etcd's authentication)"
    return None
