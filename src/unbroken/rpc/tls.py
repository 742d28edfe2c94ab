"""Mutual TLS on the control channel of a job across hosts: the credentials a party holds, their
file, gRPC's credentials made from them, and the identity the peer of a call proved.

Every party of such a job holds :class:`Credentials`: the run's token, the job's certificate
authority (its certificate: whom it trusts), and a certificate of its own signed by that
authority, with its key. A certificate's common name is its holder's identity: the control
plane (:data:`CONTROL_NAME`), a node (:func:`node_identity`: ``node:NAME``) or the command line
on the control plane's host (:data:`ADMIN`). The control plane's certificate is for the server
alone and the others' for clients alone (extended key usage), and a client checks the server's
certificate for :data:`CONTROL_NAME` whatever address it dialled (an IP, a Kubernetes name), so
a host's agent sends its token and obeys orders only once the server proved it holds the job's
control-plane certificate; the server asks every client for a certificate of the same authority
(``require_client_auth``).

The credentials file is JSON, mode 0600 (:func:`write_credentials`); it holds a private key
and the token, so :func:`read_credentials` refuses one that group or others may read. The
certificates are made by :mod:`unbroken.rpc.pki`; this module needs only the standard library
and grpc.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

#: The name in the control plane's certificate that every client checks it for.
CONTROL_NAME = "unbroken-control"
#: The identity of the command line on the control plane's host (``unbroken inject``, ...).
ADMIN = "admin"
#: A node's identity is this prefix and its name.
NODE_PREFIX = "node:"
#: The format's version, the first key of a credentials file.
FORMAT = "unbroken-credentials"
_KEYS = ("identity", "token", "ca", "cert", "key")


class CredentialsError(ValueError):
    """Credentials that cannot be read or used; the message names the file and the problem."""


def node_identity(node: str) -> str:
    """The identity of node ``node``'s certificate."""
    return NODE_PREFIX + node


def node_of(identity: str | None) -> str | None:
    """The node an identity names, or None when it names none."""
    if identity is None or not identity.startswith(NODE_PREFIX):
        return None
    return identity[len(NODE_PREFIX) :] or None


@dataclass(frozen=True)
class Credentials:
    """What one party of a job across hosts holds: its identity, the run's token, the job's
    certificate authority (PEM) and its own certificate and key (PEM)."""

    identity: str
    token: str
    ca: bytes
    cert: bytes
    key: bytes

    @property
    def node(self) -> str | None:
        """The node these credentials speak for (None: the control plane or the admin)."""
        return node_of(self.identity)

    def to_json(self) -> dict[str, Any]:
        return {
            FORMAT: 1,
            "identity": self.identity,
            "token": self.token,
            "ca": self.ca.decode(),
            "cert": self.cert.decode(),
            "key": self.key.decode(),
        }

    @staticmethod
    def from_json(data: object) -> Credentials:
        """Raises :class:`ValueError` naming what is missing."""
        if not isinstance(data, dict) or data.get(FORMAT) != 1:
            raise ValueError("not a credentials file of this version")
        for key in _KEYS:
            if not isinstance(data.get(key), str) or not data[key]:
                raise ValueError(f"{key!r} is missing")
        return Credentials(
            identity=data["identity"],
            token=data["token"],
            ca=data["ca"].encode(),
            cert=data["cert"].encode(),
            key=data["key"].encode(),
        )


def write_credentials(path: Path, creds: Credentials) -> None:
    """``creds`` in a new file at ``path``, 0600 from its creation: written under a new name
    (``O_EXCL``, ``O_NOFOLLOW``) and renamed over ``path``, so a link planted there is never
    written through."""
    tmp = path.parent / f".{path.name}-{secrets.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(creds.to_json(), f)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def private_file_problem(st: os.stat_result) -> str:
    """Why a file of secrets with status ``st`` must not be used ("" when it may): another
    user owns it, or group or others may read or write it."""
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        return f"readable by others (mode {stat.S_IMODE(st.st_mode):o}); chmod 600 it"
    return ""


def read_credentials(path: Path, flag: str = "--credentials") -> Credentials:
    """The credentials in ``path`` (``flag`` names it in the one-line error)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise CredentialsError(f"{flag} {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, encoding="utf-8") as f:
        problem = private_file_problem(os.fstat(f.fileno()))
        if problem:
            raise CredentialsError(f"{flag} {path}: {problem}")
        try:
            return Credentials.from_json(json.load(f))
        except (OSError, ValueError) as exc:
            raise CredentialsError(f"{flag} {path}: {exc}") from None


def server_credentials(creds: Credentials) -> grpc.ServerCredentials:
    """The control plane's side: its certificate, and a client certificate of the job's
    authority required of every peer."""
    return grpc.ssl_server_credentials(
        [(creds.key, creds.cert)], root_certificates=creds.ca, require_client_auth=True
    )


def channel_credentials(creds: Credentials) -> grpc.ChannelCredentials:
    """A client's side: the job's authority to check the server by, and its own certificate."""
    return grpc.ssl_channel_credentials(
        root_certificates=creds.ca, private_key=creds.key, certificate_chain=creds.cert
    )


#: The channel option that makes a client check the server's certificate for
#: :data:`CONTROL_NAME` rather than the address it dialled.
CHANNEL_OPTIONS = (("grpc.ssl_target_name_override", CONTROL_NAME),)


def peer_identity(context: Any) -> str | None:
    """The identity (certificate common name) the peer of a call proved; None over a channel
    without TLS."""
    auth: dict[str, list[bytes]] = context.auth_context() or {}
    names = list(auth.get("x509_common_name") or [])
    if len(names) != 1:
        return None
    name = names[0]
    return name.decode() if isinstance(name, bytes) else str(name)
