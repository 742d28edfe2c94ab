"""A rendezvous ``TCPStore`` that listens on one address only.

``TCPStore(host, port, is_master=True)`` binds its server to every interface whatever ``host``
says, and the store has no authentication: anyone who reaches the port can read and overwrite
the ranks' rendezvous keys. Here the socket is bound by us, to ``host`` alone (127.0.0.1 for the
job manager's stores), and handed to the store with ``master_listen_fd``; the store owns it from
then on and closes it with itself.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

_BACKLOG = 4096


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``port`` 0: any free one) and listening.

    Raises ``OSError`` when the address cannot be bound (in use, or not of this machine).
    """
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    if not infos:  # pragma: no cover - getaddrinfo raises instead
        raise OSError(f"{host} has no address")
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def host_store(host: str, port: int, timeout: timedelta | None = None) -> Any:
    """The master side of a ``TCPStore`` listening on ``host:port`` and nowhere else.

    Raises ``OSError`` when the address cannot be bound, and the store's own errors
    (``RuntimeError``) when it cannot start.
    """
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    sock = listening_socket(host, port)
    bound = int(sock.getsockname()[1])
    fd = sock.detach()  # the store closes the listening socket with itself
    kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    return TCPStore(
        host,
        bound,
        is_master=True,
        wait_for_workers=False,
        master_listen_fd=fd,
        use_libuv=True,
        **kwargs,
    )
