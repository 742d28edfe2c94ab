"""The job's certificate authority and the certificates it signs (:mod:`unbroken.rpc.tls`).

The authority is part of the job's secret material, beside its token: ``ca.crt`` and ``ca.key``
in the token file's directory (:func:`authority_paths`; on Kubernetes, keys of the job's
Secret). :func:`load_authority` reads it, :func:`new_authority` makes one, and
:meth:`Authority.issue` signs the certificate of one party: the control plane's (for the
server alone, named :data:`~unbroken.rpc.tls.CONTROL_NAME` and the addresses it listens on),
a node's (``node:NAME``, for a client alone) or the admin's. Keys are ECDSA P-256.

Imports ``cryptography``: only ``unbroken serve``, ``unbroken credentials`` and a host that
makes its own certificate from the authority import this module.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from unbroken.rpc.tls import CONTROL_NAME, Credentials, CredentialsError, private_file_problem

#: The authority's files in the directory of the job's token.
CA_CERT = "ca.crt"
CA_KEY = "ca.key"
#: How long the authority, and a certificate it signs, stay valid.
CA_DAYS = 3650
LEAF_DAYS = 825
#: Certificates are valid from this long before they are made (clocks of hosts differ).
_SKEW = datetime.timedelta(hours=1)


def authority_paths(token: Path) -> tuple[Path, Path]:
    """Where the authority of the job whose token is the file ``token`` lies."""
    return token.parent / CA_CERT, token.parent / CA_KEY


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _usage(*, sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=sign,
        crl_sign=sign,
        encipher_only=False,
        decipher_only=False,
    )


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


@dataclass(frozen=True)
class Authority:
    """The job's certificate authority: its certificate and key (PEM)."""

    cert: bytes
    key: bytes

    def issue(
        self, identity: str, token: str, *, server: bool = False, names: tuple[str, ...] = ()
    ) -> Credentials:
        """The credentials of ``identity``: a certificate for a server (``server``, with
        :data:`CONTROL_NAME` and ``names`` as its subject alternative names) or a client."""
        ca_cert = x509.load_pem_x509_certificate(self.cert)
        ca_key = serialization.load_pem_private_key(self.key, password=None)
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise CredentialsError(f"{CA_KEY}: not an ECDSA key")
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(identity))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _SKEW)
            .not_valid_after(
                min(now + datetime.timedelta(days=LEAF_DAYS), ca_cert.not_valid_after_utc)
            )
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_usage(sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server:
            sans = [x509.DNSName(CONTROL_NAME), *(_san(n) for n in dict.fromkeys(names) if n)]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        return Credentials(
            identity=identity,
            token=token,
            ca=self.cert,
            cert=cert.public_bytes(serialization.Encoding.PEM),
            key=_key_pem(key),
        )


def new_authority(job: str) -> Authority:
    """A new certificate authority for the job ``job`` ("": a job not named yet)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    name = _name(f"unbroken job {job}" if job else "unbroken job authority")
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _SKEW)
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(sign=True), critical=True)
        .sign(key, hashes.SHA256())
    )
    return Authority(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _write_private(path: Path, data: bytes, mode: int) -> None:
    tmp = path.parent / f".{path.name}-{os.getpid()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def save_authority(authority: Authority, token: Path) -> None:
    """Write ``authority`` beside the token file ``token`` (the key 0600)."""
    cert, key = authority_paths(token)
    _write_private(key, authority.key, 0o600)
    _write_private(cert, authority.cert, 0o644)


def load_authority(token: Path, flag: str) -> Authority | None:
    """The authority beside the token file ``token``; None when neither of its files is
    there. Raises :class:`CredentialsError` naming ``flag`` when one is missing, or the key
    is not this user's alone."""
    cert_path, key_path = authority_paths(token)
    if not cert_path.exists() and not key_path.exists():
        return None
    try:
        cert = cert_path.read_bytes()
        fd = os.open(key_path, os.O_RDONLY | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            problem = private_file_problem(os.fstat(f.fileno()))
            if problem:
                raise CredentialsError(f"{flag} {token}: the job's {key_path.name}: {problem}")
            key = f.read()
    except OSError as exc:
        raise CredentialsError(
            f"{flag} {token}: the job's authority {exc.filename}: {exc.strerror or exc}"
        ) from None
    try:
        x509.load_pem_x509_certificate(cert)
        serialization.load_pem_private_key(key, password=None)
    except ValueError as exc:
        raise CredentialsError(f"{flag} {token}: the job's authority: {exc}") from None
    return Authority(cert, key)
