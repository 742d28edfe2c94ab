"""Hosts on this machine for the multi-host tests: each *host* is a network namespace with its own
address on a bridge (plane A) and, when asked, a second veth on a second bridge (plane B).

The root namespace holds an address on every bridge (``.254``): the control plane listens there,
as it would on another host. Everything is named ``ub<pid>...`` and deleted by :meth:`close`;
:func:`hosts` skips the test, with the reason, where ``ip netns`` is not permitted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

#: Interface of each plane inside a host's namespace (what GLOO_SOCKET_IFNAME names).
PLANE_IFNAMES = ("pa0", "pb0")


class NetnsError(RuntimeError):
    """An ``ip`` command failed; the message has the command and its stderr."""


def _ip(*args: str, netns: str | None = None) -> None:
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        raise NetnsError(f"{' '.join(cmd)}: {done.stderr.strip()}")


@dataclass
class Hosts:
    """``n`` namespaces on ``planes`` bridges; :meth:`address` of host i on plane p."""

    n: int
    planes: int = 1
    tag: str = field(default_factory=lambda: f"ub{os.getpid()}")
    created_ns: list[str] = field(default_factory=list)
    created_links: list[str] = field(default_factory=list)

    def ns(self, i: int) -> str:
        return f"{self.tag}h{i}"

    def bridge(self, plane: int) -> str:
        return f"{self.tag}b{'ab'[plane]}"

    def host_veth(self, i: int, plane: int) -> str:
        """The root-namespace end of host i's veth on ``plane`` (taking it down cuts the link)."""
        return f"{self.tag}h{i}{'ab'[plane]}"

    def subnet(self, plane: int) -> str:
        return f"10.{77 + plane}.{os.getpid() % 250}"

    def address(self, i: int, plane: int = 0) -> str:
        return f"{self.subnet(plane)}.{i + 1}"

    def root_address(self, plane: int = 0) -> str:
        return f"{self.subnet(plane)}.254"

    def create(self) -> None:
        for plane in range(self.planes):
            br = self.bridge(plane)
            _ip("link", "add", br, "type", "bridge")
            self.created_links.append(br)
            _ip("addr", "add", f"{self.root_address(plane)}/24", "dev", br)
            _ip("link", "set", br, "up")
        for i in range(self.n):
            ns = self.ns(i)
            _ip("netns", "add", ns)
            self.created_ns.append(ns)
            _ip("link", "set", "lo", "up", netns=ns)
            for plane in range(self.planes):
                outer, inner = self.host_veth(i, plane), PLANE_IFNAMES[plane]
                _ip("link", "add", outer, "type", "veth", "peer", "name", inner, "netns", ns)
                self.created_links.append(outer)
                _ip("link", "set", outer, "master", self.bridge(plane))
                _ip("link", "set", outer, "up")
                _ip("addr", "add", f"{self.address(i, plane)}/24", "dev", inner, netns=ns)
                _ip("link", "set", inner, "up", netns=ns)

    def set_link(self, i: int, up: bool, plane: int = 0) -> None:
        """Take host i's link on ``plane`` down (``ip link set DEV down``) or up again."""
        _ip("link", "set", self.host_veth(i, plane), "up" if up else "down")

    def set_rate(self, i: int, rate: str | None, plane: int = 0) -> None:
        """Slow host i's link on ``plane`` down to ``rate`` (``tc`` token bucket on the traffic
        towards it, e.g. ``"8mbit"``), or lift the limit (None). The carrier stays up."""
        dev = self.host_veth(i, plane)
        if rate is None:
            argv = ["tc", "qdisc", "del", "dev", dev, "root"]
        else:
            argv = ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate]
            argv += ["burst", "32kbit", "latency", "400ms"]
        subprocess.run(argv, check=True, capture_output=True, timeout=10)

    def argv(self, i: int, cmd: Sequence[str]) -> list[str]:
        """``cmd`` run inside host i's namespace."""
        return ["ip", "netns", "exec", self.ns(i), *cmd]

    def close(self) -> None:
        for link in reversed(self.created_links):
            subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=10)
        for ns in reversed(self.created_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        self.created_links.clear()
        self.created_ns.clear()


def unavailable() -> str:
    """Why namespaces cannot be made here, or ""."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"ub{os.getpid()}probe"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if done.returncode != 0:
        return f"`ip netns add` is not permitted: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


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
