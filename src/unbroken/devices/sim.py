"""The ``sim`` health provider: device faults injected by hand, from any process.

Each node's device state is one JSON file, ``<state_dir>/<node>.json``::

    {"format": "unbroken-sim-devices", "version": 1, "node": "node-1", "devices": 2,
     "faults": {"0": {"code": "80E01801", "detail": "injected", "at": 1767225600.0}}}

A device listed under ``faults`` is unhealthy with that code since ``at``; every other device
is healthy. A device listed under ``resets`` (an optional object: ``{"1": {"code": "80E18005",
"at": ..., "until": ...}}``) is being reset (the device plugin's ``-hotReset=2``,
:func:`reset_device`): the reset took its fault away, and it stays unavailable, reporting the
fault's code, until ``until``; then it is healthy. A reset is modelled by its duration alone.
A device listed under ``silent`` (an optional object shaped like ``faults``) computes
wrong without saying so, as silent data corruption does: its health stays good and only a
compute check finds it, the online stress test's device check (:mod:`unbroken.worker.stress`
reads :func:`silent_fault` and perturbs the product it computes on such a device).

:func:`inject_device_fault`, :func:`inject_silent_fault` and :func:`clear_device_fault` (what
``unbroken inject device`` and ``unbroken inject sdc`` run) change a file under a per-node
lock and replace it atomically (write a temporary file, then rename), so the provider, polling
from the run's process, always reads a whole file. A file that is not valid state is reported
with its path and the problem, never silently treated as healthy.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from unbroken.devices.health import DeviceHealth, DeviceStateError

#: How long a simulated device reset keeps the device unavailable (``-hotReset=2``).
RESET_S_DEFAULT = 2.0
FORMAT = "unbroken-sim-devices"
VERSION = 1
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class SimFault:
    """A fault injected into one simulated device."""

    code: str
    detail: str
    at: float


@dataclass(frozen=True)
class NodeState:
    """One node's simulated devices: how many, and the faulty ones by index."""

    node: str
    devices: int
    faults: Mapping[int, SimFault]
    silent: Mapping[int, SimFault] = field(default_factory=dict)
    resets: Mapping[int, Reset] = field(default_factory=dict)

    def health(self, now: float) -> tuple[DeviceHealth, ...]:
        out = []
        for d in range(self.devices):
            fault = self.faults.get(d)
            reset = self.resets.get(d)
            if fault is not None:
                out.append(
                    DeviceHealth(self.node, d, False, fault.code, fault.detail, since_at=fault.at)
                )
            elif reset is not None and now < reset.until:
                detail = f"resetting until {reset.until:.3f}"
                out.append(DeviceHealth(self.node, d, False, reset.code, detail, since_at=reset.at))
            else:
                out.append(DeviceHealth(self.node, d, healthy=True))
        return tuple(out)


@dataclass(frozen=True)
class Reset:
    """A reset of one simulated device: it took the fault ``code`` away at ``at`` and the
    device is unavailable until ``until``."""

    code: str
    at: float
    until: float


class SimProvider:
    """Health of simulated devices, read from ``state_dir`` at every poll.

    Creates a healthy state file for each node that has none; an existing file (faults
    injected before the run started) is kept when it describes the same number of devices.
    """

    def __init__(
        self, state_dir: Path, nodes: Mapping[str, int], clock: Callable[[], float] = time.time
    ) -> None:
        self._dir = Path(state_dir)
        self._nodes = dict(nodes)
        self._clock = clock
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DeviceStateError(
                f"cannot create simulated device state directory {self._dir}: {exc.strerror or exc}"
            ) from None
        for node, count in self._nodes.items():
            if count < 0:
                raise ValueError(f"node {node}: devices must be >= 0, got {count}")
            path = state_path(self._dir, node)
            with _locked(self._dir, node):
                if not path.exists():
                    _write(path, NodeState(node, count, {}))
                    continue
                existing = _read(path, node)
                if existing.devices != count:
                    raise DeviceStateError(
                        f"{path}: simulated node {node} has {existing.devices} devices, but the "
                        f"cluster gives it {count}; delete the file to start over"
                    )

    @property
    def state_dir(self) -> Path:
        return self._dir

    def poll(self) -> tuple[DeviceHealth, ...]:
        out: list[DeviceHealth] = []
        now = self._clock()
        for node in self._nodes:
            out.extend(_read(state_path(self._dir, node), node).health(now))
        return tuple(out)


def state_path(state_dir: Path, node: str) -> Path:
    """The state file of ``node`` (node names are checked: they become file names)."""
    if not _NODE_NAME.fullmatch(node):
        raise ValueError(
            f"node name {node!r} is not usable for simulated devices: "
            "use letters, digits, '.', '_' and '-', starting with a letter or digit"
        )
    return Path(state_dir) / f"{node}.json"


def inject_device_fault(
    state_dir: Path, node: str, device: int, code: str, detail: str = "", at: float | None = None
) -> None:
    """Make a simulated device faulty with ``code`` (replacing an earlier fault's code)."""
    if not code or code.strip() != code:
        raise ValueError(f"a device fault code must be a non-empty word, got {code!r}")
    stamp = time.time() if at is None else at
    with _locked(Path(state_dir), node):
        state = _read_existing(Path(state_dir), node)
        _check_device(state, device)
        faults = {**state.faults, device: SimFault(code, detail, stamp)}
        _write(state_path(Path(state_dir), node), replace(state, faults=faults))


def clear_device_fault(state_dir: Path, node: str, device: int) -> bool:
    """Make a simulated device healthy again (a silent fault of it too); False when it was
    not faulty."""
    with _locked(Path(state_dir), node):
        state = _read_existing(Path(state_dir), node)
        _check_device(state, device)
        if device not in state.faults and device not in state.silent:
            return False
        faults = {d: f for d, f in state.faults.items() if d != device}
        silent = {d: f for d, f in state.silent.items() if d != device}
        _write(
            state_path(Path(state_dir), node),
            NodeState(node, state.devices, faults, silent, state.resets),
        )
        return True


def reset_device(state_dir: Path, node: str, device: int, at: float, reset_s: float) -> Reset:
    """Reset a simulated device at ``at`` (``-hotReset=2``): its fault is gone, and it is
    unavailable (reporting the fault's code) for ``reset_s`` seconds; then it is healthy."""
    if not reset_s >= 0:
        raise ValueError(f"a device reset takes >= 0 s, got {reset_s}")
    with _locked(Path(state_dir), node):
        state = _read_existing(Path(state_dir), node)
        _check_device(state, device)
        fault = state.faults.get(device)
        if fault is None:
            raise ValueError(f"device {device} of {node} reports no fault; nothing to reset")
        reset = Reset(fault.code, at, at + reset_s)
        faults = {d: f for d, f in state.faults.items() if d != device}
        resets = {**state.resets, device: reset}
        _write(state_path(Path(state_dir), node), replace(state, faults=faults, resets=resets))
        return reset


def inject_silent_fault(
    state_dir: Path, node: str, device: int, code: str, detail: str = "", at: float | None = None
) -> None:
    """Make a simulated device compute wrong without a word (silent data corruption)."""
    if not code or code.strip() != code:
        raise ValueError(f"a device fault code must be a non-empty word, got {code!r}")
    stamp = time.time() if at is None else at
    with _locked(Path(state_dir), node):
        state = _read_existing(Path(state_dir), node)
        _check_device(state, device)
        silent = {**state.silent, device: SimFault(code, detail, stamp)}
        _write(state_path(Path(state_dir), node), replace(state, silent=silent))


def silent_fault(state_dir: Path, node: str, device: int) -> SimFault | None:
    """The silent fault of a simulated device, None when it computes right (or when the
    node has no state file: not a simulated device)."""
    path = state_path(Path(state_dir), node)
    if not path.exists():
        return None
    return _read(path, node).silent.get(device)


def read_node_state(state_dir: Path, node: str) -> NodeState:
    """The current state of one simulated node (for ``unbroken inject`` and tests)."""
    return _read_existing(Path(state_dir), node)


# -- files ---------------------------------------------------------------------------------


def _read_existing(state_dir: Path, node: str) -> NodeState:
    path = state_path(state_dir, node)
    if not path.exists():
        known = sorted(p.stem for p in state_dir.glob("*.json")) if state_dir.is_dir() else []
        listed = ", ".join(known) if known else "none; is the run started?"
        raise DeviceStateError(
            f"no simulated node {node!r} under {state_dir} (simulated nodes: {listed})"
        )
    return _read(path, node)


def _check_device(state: NodeState, device: int) -> None:
    if not 0 <= device < state.devices:
        span = f"devices 0-{state.devices - 1}" if state.devices else "no devices"
        raise ValueError(f"node {state.node} has {span}; there is no device {device}")


def _read(path: Path, node: str) -> NodeState:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DeviceStateError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return _parse(json.loads(text), node)
    except (ValueError, TypeError) as exc:
        raise DeviceStateError(
            f"{path}: malformed simulated device state ({exc}); fix it or delete the file"
        ) from None


def _parse(raw: Any, node: str) -> NodeState:
    if not isinstance(raw, dict):
        raise ValueError("expected a JSON object")
    if raw.get("format") != FORMAT:
        raise ValueError(f"'format' is {raw.get('format')!r}, expected {FORMAT!r}")
    if raw.get("version") != VERSION:
        raise ValueError(f"'version' is {raw.get('version')!r}, this unbroken reads {VERSION}")
    if raw.get("node") != node:
        raise ValueError(f"'node' is {raw.get('node')!r}, expected {node!r}")
    devices = raw.get("devices")
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 0:
        raise ValueError(f"'devices' is {devices!r}, expected a count >= 0")
    faults_raw = raw.get("faults")
    if not isinstance(faults_raw, dict):
        raise ValueError(f"'faults' is {faults_raw!r}, expected an object")
    silent_raw = raw.get("silent", {})
    if not isinstance(silent_raw, dict):
        raise ValueError(f"'silent' is {silent_raw!r}, expected an object")
    resets_raw = raw.get("resets", {})
    if not isinstance(resets_raw, dict):
        raise ValueError(f"'resets' is {resets_raw!r}, expected an object")
    return NodeState(
        node,
        devices,
        _parse_faults(faults_raw, devices),
        _parse_faults(silent_raw, devices),
        _parse_resets(resets_raw, devices),
    )


def _parse_resets(resets_raw: dict[Any, Any], devices: int) -> dict[int, Reset]:
    resets: dict[int, Reset] = {}
    for key, value in resets_raw.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) < devices):
            raise ValueError(f"reset key {key!r} is not a device index below {devices}")
        if not isinstance(value, dict):
            raise ValueError(f"reset of device {key} is {value!r}, expected an object")
        code, at, until = value.get("code"), value.get("at"), value.get("until")
        if not isinstance(code, str) or not code:
            raise ValueError(f"reset of device {key}: 'code' is {code!r}, expected a string")
        for name, stamp in (("at", at), ("until", until)):
            if not isinstance(stamp, int | float) or isinstance(stamp, bool):
                raise ValueError(f"reset of device {key}: {name!r} is {stamp!r}, expected a time")
        assert isinstance(at, int | float) and isinstance(until, int | float)
        resets[int(key)] = Reset(code, float(at), float(until))
    return resets


def _parse_faults(faults_raw: dict[Any, Any], devices: int) -> dict[int, SimFault]:
    faults: dict[int, SimFault] = {}
    for key, value in faults_raw.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) < devices):
            raise ValueError(f"fault key {key!r} is not a device index below {devices}")
        if not isinstance(value, dict):
            raise ValueError(f"fault of device {key} is {value!r}, expected an object")
        code, detail, at = value.get("code"), value.get("detail", ""), value.get("at")
        if not isinstance(code, str) or not code:
            raise ValueError(f"fault of device {key}: 'code' is {code!r}, expected a string")
        if not isinstance(detail, str):
            raise ValueError(f"fault of device {key}: 'detail' is {detail!r}, expected a string")
        if not isinstance(at, int | float) or isinstance(at, bool):
            raise ValueError(f"fault of device {key}: 'at' is {at!r}, expected a time")
        faults[int(key)] = SimFault(code, detail, float(at))
    return faults


def _write(path: Path, state: NodeState) -> None:
    data: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "node": state.node,
        "devices": state.devices,
        "faults": {
            str(d): {"code": f.code, "detail": f.detail, "at": f.at}
            for d, f in sorted(state.faults.items())
        },
    }
    if state.resets:
        data["resets"] = {
            str(d): {"code": r.code, "at": r.at, "until": r.until}
            for d, r in sorted(state.resets.items())
        }
    if state.silent:
        data["silent"] = {
            str(d): {"code": f.code, "detail": f.detail, "at": f.at}
            for d, f in sorted(state.silent.items())
        }
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def _locked(state_dir: Path, node: str) -> Iterator[None]:
    """Serialise read-modify-write of one node's file across processes."""
    lock_path = state_path(state_dir, node).with_suffix(".lock")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise DeviceStateError(f"cannot lock {lock_path}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
