"""A process forked from a rank lets go of the rank's TCP connections.

A fork copies every file descriptor, the rank's gloo links included, and a TCP connection
closes only when its last descriptor does. A data loader's worker processes are forked from the
rank while its process group is up: when the rank then leaves the group (an in-process
recovery) or dies, its workers still hold the links open, and the peers blocked in a
collective with it never see them close; they wait out the group's timeout instead of failing
at once (30 s a recovery with the default ``comm_timeout_s``).

:func:`install` registers :func:`close_inherited_links` to run in every child forked from this
process (``os.register_at_fork``: ``os.fork`` and ``multiprocessing``'s fork start method).
It closes the child's copies of the established TCP connections; the rank's own descriptors,
and the connections, are untouched. Listening sockets, Unix sockets and pipes (how a data
loader's workers talk to the rank) are kept. Standard library only.
"""

from __future__ import annotations

import os

from unbroken.worker.linkfault import connected

_installed = False


def _socket_fds() -> dict[int, list[int]]:
    """This process's sockets: inode -> every descriptor of it."""
    fds: dict[int, list[int]] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed meanwhile, or the listing's own descriptor
        if target.startswith("socket:[") and target.endswith("]"):
            fds.setdefault(int(target[8:-1]), []).append(int(name))
    return fds


def close_inherited_links() -> int:
    """Close every descriptor of an established TCP connection in this process (a child
    forked from a rank); returns how many were closed."""
    try:
        fds = _socket_fds()
        links = connected({inode: descriptors[0] for inode, descriptors in fds.items()})
    except OSError:
        return 0
    closed = 0
    for inode in links:
        for fd in fds[inode]:
            try:
                os.close(fd)
            except OSError:
                continue
            closed += 1
    return closed


def install() -> None:
    """Have every child forked from this process close its copies of the TCP connections."""
    global _installed
    if _installed:
        return
    os.register_at_fork(after_in_child=close_inherited_links)
    _installed = True
