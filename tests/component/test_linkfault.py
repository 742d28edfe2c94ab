"""The link fault on real sockets: ``ss -K`` resets exactly the connections it should; and
the links a block of code opened are noted and cut, listeners left alone."""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Iterator

import pytest

from unbroken.worker.linkfault import LinkFaultError, OpenedLinks, peer_links, reset_links

pytestmark = pytest.mark.component

needs_ss = pytest.mark.skipif(
    shutil.which("ss") is None or os.geteuid() != 0, reason="needs ss and root (socket destroy)"
)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket, int]]:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    yield client, accepted, port
    for s in (client, accepted, server):
        s.close()


@needs_ss
def test_the_kernel_resets_both_ends(pair: tuple[socket.socket, socket.socket, int]) -> None:
    client, _accepted, port = pair
    mine = peer_links(os.getpid())
    assert {(c.local[1], c.remote[1]) for c in mine} >= {
        (client.getsockname()[1], port),
        (port, client.getsockname()[1]),
    }
    reset_links(
        os.getpid(),
        exclude_ports=[p.remote[1] for p in mine if port not in (p.local[1], p.remote[1])],
    )
    with pytest.raises((ConnectionResetError, ConnectionAbortedError, BrokenPipeError)):
        client.sendall(b"x")
        client.recv(1)


@needs_ss
def test_excluded_ports_are_left_alone(pair: tuple[socket.socket, socket.socket, int]) -> None:
    client, accepted, port = pair
    others = [c.remote[1] for c in peer_links(os.getpid()) if port not in (c.local[1], c.remote[1])]
    with pytest.raises(LinkFaultError, match="no established TCP connection"):
        reset_links(os.getpid(), exclude_ports=[port, *others])
    client.sendall(b"ok")
    assert accepted.recv(2) == b"ok"


@needs_ss
def test_a_process_that_does_not_exist_is_an_error() -> None:
    with pytest.raises(LinkFaultError, match="process 999999999 does not exist"):
        reset_links(999999999)


def _inode(sock: socket.socket) -> int:
    return os.fstat(sock.fileno()).st_ino


def test_the_links_opened_in_a_block_are_noted_without_listeners_or_older_links(
    pair: tuple[socket.socket, socket.socket, int],
) -> None:
    older, _older_accepted, _ = pair
    server = socket.create_server(("127.0.0.1", 0))
    with OpenedLinks() as links:
        listener = socket.create_server(("127.0.0.1", 0))
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        local_pair = socket.socketpair()  # a Unix socket pair: a pipe, not a link
        datagram = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        datagram.connect(server.getsockname())  # has a peer address, and is no link either
    try:
        assert links.inodes == {_inode(client), _inode(accepted)}
        assert _inode(listener) not in links.inodes and _inode(older) not in links.inodes
    finally:
        for s in (client, accepted, listener, server, datagram, *local_pair):
            s.close()


def test_cutting_the_links_ends_a_wait_on_either_end_and_spares_the_others(
    pair: tuple[socket.socket, socket.socket, int],
) -> None:
    older, older_accepted, _ = pair
    server = socket.create_server(("127.0.0.1", 0))
    with OpenedLinks() as links:
        client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()  # the far end: another process's socket, as far as links knows
    try:
        client.settimeout(5.0)
        accepted.settimeout(5.0)
        assert links.cut() == 1
        assert accepted.recv(1) == b""  # the peer sees the link close at once
        assert client.recv(1) == b""  # and so does a reader on this end
        older.sendall(b"ok")
        assert older_accepted.recv(2) == b"ok"
    finally:
        for s in (client, accepted, server):
            s.close()
