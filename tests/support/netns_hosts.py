"""Hosts on this machine for the multi-host tests: :class:`unbroken.cli.nethosts.NetHosts`
(each *host* a network namespace with its own address on a bridge per plane; the root namespace
holds ``.254`` on every bridge, where the control plane listens, as it would on another host),
skipped with the reason where ``ip netns`` is not permitted (:func:`hosts`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from unbroken.cli.nethosts import NetHosts, plane_ifname, unavailable

#: Interface of each plane inside a host's namespace (what GLOO_SOCKET_IFNAME names).
PLANE_IFNAMES = (plane_ifname(0), plane_ifname(1))
Hosts = NetHosts


@contextmanager
def hosts(n: int, planes: int = 1) -> Iterator[Hosts]:
    why = unavailable()
    if why:
        pytest.skip(why)
    h = Hosts(n, planes)
    try:
        h.create()
        yield h
    finally:
        h.close()
