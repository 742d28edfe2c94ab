"""The calls a person's command makes on a running job's control plane, and their bodies.

``unbroken inject`` (:data:`INJECT`), ``unbroken release`` (:data:`RELEASE`), ``unbroken
stress-test`` (:data:`STRESS_TEST`) and ``unbroken link`` (:data:`LINK`) each make one call
whose body is a JSON object; the control plane answers ``{"ok": true, ...}`` or ``{"ok":
false, "error": ...}``. The control plane reads a body with :func:`check_call` before the job
manager sees it: each field has its type and range (:mod:`unbroken.protocol.wire`), and what
is not well formed is refused as :class:`~unbroken.protocol.wire.ProtocolError` naming the
call and the field. What a field means (which fault kinds, nodes and ranks exist) is the job
manager's to check. Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from unbroken.protocol.wire import (
    DEVICE_MAX,
    RANK_MAX,
    ProtocolError,
    flag,
    integer,
    number,
    obj,
    optional_integer,
    optional_text,
    show,
    text,
)

INJECT = "Inject"
RELEASE = "Release"
STRESS_TEST = "StressTest"
LINK = "Link"


@dataclass(frozen=True)
class InjectRequest:
    """``unbroken inject KIND``: the fault and its target (None: not given)."""

    kind: str
    rank: int | None = None
    pod: str | None = None
    node: str | None = None
    device: int | None = None
    code: str | None = None
    clear: bool = False
    peer: int | None = None
    #: A throttle's share of one CPU.
    cpu: float | None = None


@dataclass(frozen=True)
class ReleaseRequest:
    """``unbroken release``: device ``device`` of node ``node`` goes back to the pool."""

    node: str
    device: int


@dataclass(frozen=True)
class LinkRequest:
    """``unbroken link``: the network plane to switch to ("": back to the preferred one)."""

    to: str = ""


def _optional_name(body: Mapping[str, Any], key: str, what: str) -> str | None:
    return None if body.get(key) is None else text(body, key, what)


def decode_inject(body: Mapping[str, Any]) -> InjectRequest:
    body = obj(body, INJECT)
    return InjectRequest(
        kind=text(body, "kind", INJECT),
        rank=optional_integer(body, "rank", INJECT, 0, RANK_MAX),
        pod=_optional_name(body, "pod", INJECT),
        node=_optional_name(body, "node", INJECT),
        device=optional_integer(body, "device", INJECT, 0, DEVICE_MAX),
        code=_optional_name(body, "code", INJECT),
        clear=flag(body, "clear", INJECT, default=False),
        peer=optional_integer(body, "peer", INJECT, 0, RANK_MAX),
        cpu=None if body.get("cpu") is None else number(body, "cpu", INJECT, 0.0, 1024.0),
    )


def decode_release(body: Mapping[str, Any]) -> ReleaseRequest:
    body = obj(body, RELEASE)
    return ReleaseRequest(
        node=text(body, "node", RELEASE), device=integer(body, "device", RELEASE, 0, DEVICE_MAX)
    )


def decode_link(body: Mapping[str, Any]) -> LinkRequest:
    body = obj(body, LINK)
    return LinkRequest(to=optional_text(body, "to", LINK))


def check_call(method: str, body: Mapping[str, Any]) -> None:
    """Refuse (:class:`ProtocolError`) a body of call ``method`` that is not well formed."""
    match method:
        case "Inject":
            decode_inject(body)
        case "Release":
            decode_release(body)
        case "Link":
            decode_link(body)
        case "StressTest":
            obj(body, STRESS_TEST)
        case _:
            raise ProtocolError(f"{show(method)} is not a call of this control plane")


__all__ = [
    "INJECT",
    "LINK",
    "RELEASE",
    "STRESS_TEST",
    "InjectRequest",
    "LinkRequest",
    "ReleaseRequest",
    "check_call",
    "decode_inject",
    "decode_link",
    "decode_release",
]
