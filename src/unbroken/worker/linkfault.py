"""A real link fault: the kernel resets the TCP connections between a rank and its peers.

:func:`reset_links` finds a process's TCP sockets (the ``socket:[inode]`` links under
``/proc/<pid>/fd``, matched with ``/proc/net/tcp`` and ``/proc/net/tcp6``), keeps the
established connections that are links to peer ranks, and has the kernel destroy each one with
``ss -K`` on its exact source and destination (root, and a kernel with socket destroy, which
the usual ones have). The rank's own socket fails with ``ECONNABORTED``, the peer's gets a RST:
exactly what a broken link does to a gloo pair.

Never touched: listening sockets; connections to or from ``exclude_ports`` (the rendezvous
store, which a rank sees as ``MASTER_PORT``, and the control plane); and, when the peers'
pids are given, any connection whose other end is not in a peer's process. Used by
``unbroken inject link`` (through the job manager, which knows every rank's pid) and by the
chaos entry ``{kind: link, rank: R, at_step: N}``, fired inside the rank itself.

The same sockets, seen from inside the process that holds them, are how a stuck gloo group is
let go: :class:`OpenedLinks` notes the connections a block of code opened (``dist.new_group``
connects a gloo group's full mesh there) and :meth:`OpenedLinks.cut` shuts them down, so every
collective of that group waiting on them fails at once, on both ends. gloo's own ``abort`` and
``shutdown`` leave such a collective waiting until the group's timeout (ten minutes for a
checkpoint group), and a process cannot exit while a thread of it waits there. Standard library
only: the worker imports it.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import subprocess
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

_ESTABLISHED = "01"
_PROC = Path("/proc")


class LinkFaultError(RuntimeError):
    """The link fault could not be injected; the message says why."""


@dataclass(frozen=True)
class Connection:
    """One established TCP connection, as this host sees it."""

    local: tuple[str, int]
    remote: tuple[str, int]
    inode: int

    def describe(self) -> str:
        return f"{_endpoint(self.local)} -> {_endpoint(self.remote)}"


def _endpoint(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _address(hex_address: str) -> tuple[str, int]:
    """``0100007F:1F90`` (tcp) or a 32-digit tcp6 address -> (host, port)."""
    host_hex, port_hex = hex_address.split(":")
    raw = bytes.fromhex(host_hex)
    # /proc/net/tcp* write the address as 32-bit words in host (little-endian) byte order.
    packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(packed)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), int(port_hex, 16)


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process ``pid`` holds open."""
    fd_dir = _PROC / str(pid) / "fd"
    try:
        return set(_sockets(fd_dir))
    except FileNotFoundError:
        raise LinkFaultError(f"process {pid} does not exist") from None
    except PermissionError:
        raise LinkFaultError(f"cannot read {fd_dir}: permission denied") from None


def _sockets(fd_dir: Path) -> dict[int, int]:
    """The sockets of the process whose descriptors ``fd_dir`` lists: inode -> one of its
    file descriptors."""
    fds: dict[int, int] = {}
    for name in os.listdir(fd_dir):
        try:
            target = os.readlink(fd_dir / name)
        except OSError:
            continue  # closed meanwhile (or, under /proc/self, the listing's own descriptor)
        if target.startswith("socket:[") and target.endswith("]"):
            fds.setdefault(int(target[8:-1]), int(name))
    return fds


def connected(sockets: Mapping[int, int]) -> set[int]:
    """The inodes of those of ``sockets`` (inode -> a descriptor of it in this process) that
    are TCP connections with a peer. Each socket is asked itself (``getpeername`` on a
    duplicate of its descriptor), not the host's connection tables: their size grows with every
    connection of the host, these questions only with the process's own."""
    out: set[int] = set()
    for inode, fd in sockets.items():
        try:
            dup = os.dup(fd)
        except OSError:
            continue  # closed meanwhile
        try:
            sock = socket.socket(fileno=dup)
        except OSError:
            os.close(dup)  # not a socket any more (the descriptor was reused)
            continue
        try:
            if sock.family in (socket.AF_INET, socket.AF_INET6) and (
                sock.type == socket.SOCK_STREAM
            ):
                sock.getpeername()  # OSError (ENOTCONN): listening, or not connected yet
                out.add(inode)
        except OSError:
            pass
        finally:
            sock.close()  # the duplicate only
    return out


def established(inodes: Collection[int] | None = None) -> list[Connection]:
    """Established TCP connections (IPv4 and IPv6) of this host, or of these socket inodes."""
    out: list[Connection] = []
    for table in ("tcp", "tcp6"):
        try:
            lines = (_PROC / "net" / table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _ESTABLISHED:
                continue
            inode = int(fields[9])
            if inode == 0 or (inodes is not None and inode not in inodes):
                continue
            out.append(Connection(_address(fields[1]), _address(fields[2]), inode))
    return out


def peer_links(
    pid: int, *, exclude_ports: Iterable[int] = (), peer_pids: Collection[int] | None = None
) -> list[Connection]:
    """The connections of process ``pid`` that are links to peers (see the module doc)."""
    excluded = {p for p in exclude_ports if p}
    mine = established(socket_inodes(pid))
    peer_ends: set[tuple[str, int]] | None = None
    if peer_pids is not None:
        inodes: set[int] = set()
        for peer in peer_pids:
            inodes |= socket_inodes(peer)
        peer_ends = {c.local for c in established(inodes)}
    return [
        c
        for c in mine
        if c.local[1] not in excluded
        and c.remote[1] not in excluded
        and (peer_ends is None or c.remote in peer_ends)
    ]


def reset(connections: Iterable[Connection]) -> list[Connection]:
    """Have the kernel destroy each connection (``ss -K``); returns those it destroyed."""
    ss = shutil.which("ss")
    if ss is None:
        raise LinkFaultError("the ss command (iproute2) is not installed: cannot reset links")
    done: list[Connection] = []
    errors: list[str] = []
    for c in connections:
        family = "-6" if ":" in c.local[0] else "-4"
        argv = [ss, "-K", "-H", "-t", family, "state", "established"]
        argv += ["src", _endpoint(c.local), "dst", _endpoint(c.remote)]
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=10.0)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise LinkFaultError(f"ss -K failed for {c.describe()}: {e}") from None
        if result.returncode == 0 and result.stdout.strip():
            done.append(c)
        else:
            why = " ".join(result.stderr.split()) or "no socket destroyed"
            errors.append(f"{c.describe()}: {why} (exit {result.returncode})")
    if errors and not done:
        raise LinkFaultError(
            "ss -K refused to reset the links (it needs root and a kernel with "
            "CONFIG_INET_DIAG_DESTROY): " + "; ".join(errors)
        )
    return done


def reset_links(
    pid: int, *, exclude_ports: Iterable[int] = (), peer_pids: Collection[int] | None = None
) -> list[Connection]:
    """Reset the links of process ``pid`` to its peers; raises :class:`LinkFaultError` when
    there is none or none could be reset."""
    links = peer_links(pid, exclude_ports=exclude_ports, peer_pids=peer_pids)
    if not links:
        scope = "its peers' processes" if peer_pids is not None else "peers"
        raise LinkFaultError(f"process {pid} has no established TCP connection to {scope}")
    return reset(links)


class OpenedLinks:
    """The established TCP connections opened in this process inside a ``with`` block.

    ``with OpenedLinks() as links: group = dist.new_group(backend="gloo")`` notes the group's
    links to its peers (listening sockets are left out: shutting one down would end gloo's
    listener thread, and the process with it). :meth:`cut` shuts them down.
    """

    def __init__(self) -> None:
        self._before: set[int] = set()
        self.inodes: frozenset[int] = frozenset()

    def __enter__(self) -> OpenedLinks:
        self._before = set(_sockets(_PROC / "self" / "fd"))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        opened = {
            inode: fd
            for inode, fd in _sockets(_PROC / "self" / "fd").items()
            if inode not in self._before
        }
        self.inodes = frozenset(connected(opened))

    def cut(self) -> int:
        """Shut down those of the connections still open; returns how many. Both ends see
        them close: every collective waiting on one fails at once."""
        done = 0
        for inode, fd in _sockets(_PROC / "self" / "fd").items():
            if inode not in self.inodes:
                continue
            try:
                dup = os.dup(fd)
            except OSError:
                continue  # closed meanwhile
            sock = socket.socket(fileno=dup)
            try:
                sock.shutdown(socket.SHUT_RDWR)
                done += 1
            except OSError:
                pass  # already shut down, or reset by the peer
            finally:
                sock.close()  # the duplicate only: gloo closes its own descriptor
        return done
