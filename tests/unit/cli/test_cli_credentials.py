"""``unbroken credentials``: a node's credentials from the job's token and authority, made when
missing; what cannot be used is refused in one line."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from unbroken.cli import main
from unbroken.rpc.pki import load_authority
from unbroken.rpc.tls import node_identity, read_credentials

pytestmark = pytest.mark.unit


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_credentials_are_made_with_the_token_and_authority_beside_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = tmp_path / "secret" / "token"
    token.parent.mkdir(mode=0o700)
    argv = ["credentials", "--secret-file", str(token), "--out-dir", str(tmp_path / "hosts")]
    assert main([*argv, "--node", "node-0", "--node", "node-1"]) == 0
    assert _mode(token) == 0o600 and _mode(tmp_path / "secret" / "ca.key") == 0o600
    first = read_credentials(tmp_path / "hosts" / "node-0.json")
    assert first.identity == node_identity("node-0") and first.node == "node-0"
    assert first.token == token.read_text().strip()
    assert _mode(tmp_path / "hosts" / "node-0.json") == 0o600
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("node node-1: ") and "--credentials node-1.json" in out[1]
    # Again: the same token and authority, a new certificate.
    authority = load_authority(token, "--secret-file")
    assert main([*argv, "--node", "node-0"]) == 0
    again = read_credentials(tmp_path / "hosts" / "node-0.json")
    assert (again.token, again.ca) == (first.token, first.ca) and again.cert != first.cert
    assert load_authority(token, "--secret-file") == authority


def test_a_token_or_authority_key_others_may_read_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = tmp_path / "token"
    token.write_text("ab" * 16 + "\n")
    os.chmod(token, 0o644)
    argv = ["credentials", "--secret-file", str(token), "--node", "n", "--out-dir", str(tmp_path)]
    assert main(argv) == 1
    assert capsys.readouterr().err == (
        f"unbroken credentials: --secret-file {token}: readable by others (mode 644); chmod "
        "600 it\n"
    )
    os.chmod(token, 0o600)
    assert main(argv) == 0
    os.chmod(tmp_path / "ca.key", 0o640)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.endswith("the job's ca.key: readable by others (mode 640); chmod 600 it\n"), err
    assert err.count("\n") == 1


def test_a_path_is_no_node_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token = tmp_path / "token"
    argv = ["credentials", "--secret-file", str(token), "--out-dir", str(tmp_path)]
    assert main([*argv, "--node", "../x"]) == 1
    assert capsys.readouterr().err == "unbroken credentials: --node '../x': not a node name\n"
    assert not token.exists()
