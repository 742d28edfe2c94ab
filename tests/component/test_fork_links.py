"""A child forked from a rank must not hold the rank's TCP links open: once the rank closes its
end, the peer sees the connection close at once, though the child lives on."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.component

# The rank: connect to the peer, fork a child that sleeps, close its own end, then wait.
RANK = textwrap.dedent(
    """
    import os, socket, sys, time
    from unbroken.worker import forks
    if sys.argv[2] == "install":
        forks.install()
    link = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    link.close()
    print(child, flush=True)
    time.sleep(60)
    """
)


@pytest.mark.parametrize(("mode", "closes"), [("install", True), ("none", False)])
def test_a_forked_child_lets_go_of_the_links(mode: str, closes: bool) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        rank = subprocess.Popen(
            [sys.executable, "-c", RANK, str(port), mode],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            peer, _ = server.accept()
            assert rank.stdout is not None
            rank.stdout.readline()  # the rank closed its end, its child lives
            peer.settimeout(2.0)
            try:
                seen_closed = peer.recv(1) == b""
            except TimeoutError:
                seen_closed = False
            peer.close()
        finally:
            os.killpg(rank.pid, signal.SIGKILL)  # the rank and its child: their own group
            rank.wait()
    assert seen_closed == closes
