"""A one-member etcd on loopback with TLS (client certificates required) or with authentication
on, for the store's ``ca_cert`` / ``cert`` / ``key`` and ``user`` / ``password`` options.

The certificates are made by ``openssl`` in a temporary directory: a CA, the member's
certificate (for ``127.0.0.1``), a client certificate the CA signed, and another CA's client
certificate (one the member must refuse). Authentication is enabled through the gateway
(``auth/user/add``, ``auth/user/grant`` of the ``root`` role, ``auth/enable``), with
``--auth-token-ttl`` short enough for a test to see a token expire.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from typing import Any

from tests.servers import find_binary, free_port, missing, port_open
from tests.servers.etcd import etcd_binary
from tests.waiting import eventually


def _openssl() -> str:
    binary = find_binary("openssl", "/usr/bin/openssl")
    if binary is None:
        missing("openssl not found (apt-get install openssl)")
    assert binary is not None
    return binary


class Certificates:
    """PEM files in ``directory``: ``ca``, ``server``/``server_key``, ``client``/``client_key``,
    and ``stranger``/``stranger_key`` (a client certificate of another CA)."""

    def __init__(self, directory: str) -> None:
        self.dir = directory
        openssl = _openssl()

        def run(*args: str) -> None:
            subprocess.run([openssl, *args], check=True, capture_output=True, cwd=directory)

        for ca in ("ca", "other-ca"):
            run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-subj", f"/CN={ca}")  # fmt: skip
        with open(os.path.join(directory, "san.cnf"), "w") as ext:
            ext.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        for name, ca in (("server", "ca"), ("client", "ca"), ("stranger", "other-ca")):
            run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
                "-out", f"{name}.csr", "-subj", f"/CN={name}")  # fmt: skip
            run("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
                "-CAcreateserial", "-days", "2", "-out", f"{name}.pem",
                "-extfile", "san.cnf")  # fmt: skip

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)


class SecureEtcd:
    """One etcd member: ``tls=True`` serves https and requires a client certificate of the
    CA; ``auth=True`` serves http with authentication on (user ``root``, password
    ``PASSWORD``)."""

    PASSWORD = "s3cret-pass"

    def __init__(self, *, tls: bool = False, auth: bool = False, token_ttl: int = 2) -> None:
        self.dir = tempfile.mkdtemp(prefix="django_locks-etcd-secure-")
        self.port, self.peer_port = free_port(), free_port()
        self.tls = tls
        self.certs = Certificates(self.dir) if tls else None
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        args = [
            etcd_binary(), "--name", "s0", "--data-dir", os.path.join(self.dir, "data"),
            "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"s0={peer}", "--auth-token-ttl", str(token_ttl),
            "--logger", "zap", "--log-outputs", "stderr",
        ]  # fmt: skip
        if self.certs is not None:
            args += ["--cert-file", self.certs.path("server.pem"),
                     "--key-file", self.certs.path("server.key"),
                     "--trusted-ca-file", self.certs.path("ca.pem"),
                     "--client-cert-auth"]  # fmt: skip
        self.log = os.path.join(self.dir, "etcd.log")
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        eventually(lambda: port_open(self.port), timeout=30, what="the secure etcd's port")
        eventually(self._serves, timeout=30, what="the secure etcd serving", every=0.1,
                   ignoring=(OSError,))  # fmt: skip
        if auth:
            self._enable_auth()

    def client_options(self) -> dict[str, Any]:
        assert self.certs is not None
        return {
            "ca_cert": self.certs.path("ca.pem"),
            "cert": self.certs.path("client.pem"),
            "key": self.certs.path("client.key"),
        }

    def _post(self, path: str, body: dict[str, Any], token: str | None = None) -> Any:
        import ssl

        context = None
        if self.certs is not None:
            context = ssl.create_default_context(cafile=self.certs.path("ca.pem"))
            context.load_cert_chain(self.certs.path("client.pem"), self.certs.path("client.key"))
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = token
        request = urllib.request.Request(
            f"{self.url}/v3/{path}", data=json.dumps(body).encode(), headers=headers
        )
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            return json.loads(response.read())

    def _serves(self) -> bool:
        return "header" in self._post("kv/range", {"key": "eA=="})

    def _enable_auth(self) -> None:
        self._post("auth/user/add", {"name": "root", "password": self.PASSWORD})
        self._post("auth/user/grant", {"user": "root", "role": "root"})
        self._post("auth/enable", {})
        time.sleep(0.2)

    def logs(self) -> str:
        with open(self.log, errors="replace") as log:
            return log.read()[-4000:]

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)
