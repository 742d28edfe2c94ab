"""``unbroken credentials --secret-file TOKEN --node NAME [--node NAME ...] [--out-dir DIR]``: the
files the hosts of a job across hosts join with.

A job's secret material is its token (the file ``TOKEN``) and its certificate authority beside
it (``ca.crt`` and ``ca.key`` in the token's directory, :mod:`unbroken.rpc.pki`). This command
makes the token (mode 0600) when ``TOKEN`` does not exist and the authority when it is not
there, then writes each node's credentials (:mod:`unbroken.rpc.tls`: the token, the authority's
certificate, and the node's own certificate and key) to ``DIR/NAME.json``, mode 0600. Each file
is copied to its host, which joins with ``unbroken launch --join ADDR:PORT --credentials
NAME.json``; the control plane is ``unbroken serve ... --secret-file TOKEN``.

``unbroken serve`` makes the credentials itself too (:func:`serve_credentials`): its own
certificate for the address it listens on, the admin's (``RUN_DIR/admin.json``, which ``unbroken
inject``, ``link``, ``release`` and ``stress-test`` use on the control plane's host), and each
cluster node's (``RUN_DIR/hosts/NODE.json``), with the authority beside its token: a new one
beside a new token (``--token-file``), the one there beside a given token (``--secret-file``).
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from unbroken.agent.remote import JoinError, read_token
from unbroken.rpc.tls import (
    ADMIN,
    CONTROL_NAME,
    Credentials,
    CredentialsError,
    node_identity,
    read_credentials,
    write_credentials,
)

if TYPE_CHECKING:
    from unbroken.rpc.pki import Authority

#: The admin's credentials in the run directory of ``unbroken serve``.
ADMIN_FILE = "admin.json"
#: The nodes' credentials' directory in the run directory of ``unbroken serve``.
HOSTS_DIR = "hosts"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "credentials", help="write the credentials hosts join a job across hosts with"
    )
    p.add_argument(
        "--secret-file",
        type=Path,
        required=True,
        help="the job's token (made, mode 0600, when missing); the job's authority is beside "
        "it (ca.crt, ca.key; made when missing)",
    )
    p.add_argument("--node", action="append", required=True, help="a node to write credentials for")
    p.add_argument(
        "--out-dir", type=Path, default=Path("."), help="where NODE.json is written (default .)"
    )


def _fail(msg: str) -> int:
    print(f"unbroken credentials: {msg}", file=sys.stderr)
    return 1


def _new_token(path: Path) -> str:
    token = secrets.token_hex(16)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def job_authority(token: Path, flag: str, *, fresh: bool, job: str) -> Authority:
    """The authority beside the token file ``token``: a new one when ``fresh`` or when none
    is there (saved beside it), else the one there."""
    from unbroken.rpc.pki import load_authority, new_authority, save_authority

    authority = None if fresh else load_authority(token, flag)
    if authority is None:
        authority = new_authority(job)
        try:
            save_authority(authority, token)
        except OSError as exc:
            raise CredentialsError(
                f"{flag} {token}: cannot write the job's authority beside it: {exc.strerror or exc}"
            ) from None
    return authority


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


def serve_credentials(
    *,
    token: Path,
    flag: str,
    secret: str,
    fresh: bool,
    job: str,
    listen_host: str,
    nodes: Sequence[str],
    run_dir: Path,
) -> Credentials:
    """The control plane's credentials for ``unbroken serve``, with the admin's and each of
    ``nodes``' written to the run directory; the authority is the one beside ``token`` (a new
    one when ``fresh``). Raises :class:`CredentialsError` (one line naming ``flag``) or
    ``OSError``."""
    authority = job_authority(token, flag, fresh=fresh, job=job)
    write_credentials(run_dir / ADMIN_FILE, authority.issue(ADMIN, secret))
    hosts = run_dir / HOSTS_DIR
    _private_dir(hosts)
    for node in nodes:
        write_credentials(hosts / f"{node}.json", authority.issue(node_identity(node), secret))
    return authority.issue(CONTROL_NAME, secret, server=True, names=(listen_host,))


def admin_credentials(run_dir: Path) -> Credentials | None:
    """The admin's credentials of a run of ``unbroken serve``; None for a run without them
    (``unbroken run``: loopback, no TLS). Raises :class:`CredentialsError`."""
    path = run_dir / ADMIN_FILE
    if not path.exists():
        return None
    return read_credentials(path, "the run's admin credentials")


def run(args: argparse.Namespace) -> int:
    token_path: Path = args.secret_file
    out_dir: Path = args.out_dir
    for node in args.node:
        if not node or "/" in node or node.startswith("."):
            return _fail(f"--node {node!r}: not a node name")
    try:
        if token_path.exists() or token_path.is_symlink():
            token = read_token(token_path, "--secret-file")
        else:
            token = _new_token(token_path)
        authority = job_authority(token_path, "--secret-file", fresh=False, job="")
        _private_dir(out_dir)
        for node in args.node:
            path = out_dir / f"{node}.json"
            write_credentials(path, authority.issue(node_identity(node), token))
            print(
                f"node {node}: {path} (mode 0600); copy it to the host and run: unbroken launch "
                f"--join ADDR:PORT --credentials {path.name}"
            )
    except (JoinError, CredentialsError) as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"{exc.filename or out_dir}: {exc.strerror or exc}")
    return 0
