"""Idle connections held open to a server, as anyone on the host can open them: TCP
connections that never send a byte, each opened again as soon as the server closes it, from a
thread of their own until :meth:`IdleConnections.stop`."""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Sequence


class IdleConnections:
    """Hold ``per_address`` idle connections to each of ``addresses`` (``host:port``)."""

    def __init__(self, addresses: Sequence[str], per_address: int) -> None:
        self._targets = [(a.rsplit(":", 1)[0], int(a.rsplit(":", 1)[1])) for a in addresses]
        self._per = per_address
        self._socks: dict[tuple[str, int], list[socket.socket]] = {t: [] for t in self._targets}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._hold, name="idle-connections", daemon=True)
        #: Held while the flood opens or closes a socket: hold it to count this process's
        #: descriptors against :meth:`open_now` without the flood moving in between.
        self.lock = threading.Lock()
        #: Connections opened, and those the servers closed, over the whole flood.
        self.opened = 0
        self.closed_by_server = 0

    def __enter__(self) -> IdleConnections:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def open_now(self) -> dict[str, int]:
        """The connections open now, per address."""
        return {f"{h}:{p}": len(s) for (h, p), s in self._socks.items()}

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30.0)
        for socks in self._socks.values():
            for s in socks:
                s.close()
            socks.clear()

    def _hold(self) -> None:
        while not self._stop.is_set():
            for target, socks in self._socks.items():
                with self.lock:
                    self._drop_closed(socks)
                while len(socks) < self._per and not self._stop.is_set():
                    with self.lock:
                        try:
                            s = socket.create_connection(target, timeout=2.0)
                        except OSError:
                            break  # the backlog is full: try again at the next round
                        socks.append(s)
                        self.opened += 1
            self._stop.wait(0.5)

    def _drop_closed(self, socks: list[socket.socket]) -> None:
        if not socks:
            return
        poller = select.poll()  # not select(): descriptors past 1024 are polled too
        by_fd = {s.fileno(): s for s in socks}
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        for fd, _ in poller.poll(0):
            s = by_fd[fd]
            try:
                s.setblocking(False)
                if s.recv(1 << 16):  # a server's greeting is read and dropped
                    continue
            except BlockingIOError:
                continue
            except OSError:
                pass
            socks.remove(s)
            s.close()
            self.closed_by_server += 1
