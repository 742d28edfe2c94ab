"""The code -> level table: shipped as data (``codes.yaml``), merged with a user override file.

:meth:`CodeTable.load` reads the shipped table and, when given, a user file of the same shape
merged over it (per code; ``unknown`` and ``escalation`` replace the shipped values). A malformed
file is a :class:`CodeTableError` naming the file, the line, the value and what was expected.

:meth:`CodeTable.level_for` gives a fault its level:

- a listed code gets the table's level;
- a device fault (kinds ``device``, ``device-memory``, ``link``, ``stress-test``,
  ``sub-health``) with an unlisted code gets the table's ``unknown`` level, except that
  ``stress-test`` and ``sub-health`` faults without a code keep their kind's default;
- a fault without a device code gets its kind's default, :data:`DEFAULT_LEVELS`;
- a fault the training processes saw themselves (``process-exit``, ``exception``, ``hang``,
  ``device-memory``, ``link``: their step failed) is never below ``RestartBusiness``, whatever
  the table says about the code alone (the table rates ``8C1F8608``, a link CQE error,
  ``NotHandle`` because operator retry usually absorbs it; when it reaches the training loop,
  the step must be redone).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import NoReturn

import yaml

from unbroken.faults.fault import FaultLevel, worst
from unbroken.protocol.kinds import FaultKind
from unbroken.spec import document
from unbroken.spec.problems import Problems, SpecError

logger = logging.getLogger(__name__)

#: Level of a fault that carries no device code, per kind. A software crash restarts the
#: business; a lost node or a failed stress test isolates (node-lost isolates the whole node,
#: see the policy); a sub-health report is only sub-health.
DEFAULT_LEVELS: dict[FaultKind, FaultLevel] = {
    FaultKind.PROCESS_EXIT: FaultLevel.RESTART_BUSINESS,
    FaultKind.EXCEPTION: FaultLevel.RESTART_BUSINESS,
    FaultKind.HANG: FaultLevel.RESTART_BUSINESS,
    FaultKind.NODE_LOST: FaultLevel.SEPARATE_NPU,
    FaultKind.DEVICE: FaultLevel.RESTART_BUSINESS,
    FaultKind.DEVICE_MEMORY: FaultLevel.RESTART_BUSINESS,
    FaultKind.LINK: FaultLevel.RESTART_BUSINESS,
    FaultKind.STRESS_TEST: FaultLevel.SEPARATE_NPU,
    FaultKind.SUB_HEALTH: FaultLevel.SUB_HEALTH,
}

_DEVICE_KINDS = frozenset(
    {
        FaultKind.DEVICE,
        FaultKind.DEVICE_MEMORY,
        FaultKind.LINK,
        FaultKind.STRESS_TEST,
        FaultKind.SUB_HEALTH,
    }
)
_CODE = re.compile(r"[0-9A-Z][0-9A-Z_\-]*")
_SHIPPED = "codes.yaml"


class CodeTableError(ValueError):
    """A malformed code table file: the message names file, line and value."""


@dataclass(frozen=True)
class Escalation:
    """Same code on the same device ``times`` times within ``window_s`` -> ManuallySeparate.
    ``times == 0`` never escalates."""

    times: int
    window_s: float


@dataclass(frozen=True)
class CodeInfo:
    level: FaultLevel
    kind: FaultKind = FaultKind.DEVICE
    what: str = ""
    escalation: Escalation | None = None  # None: the table's default rule, where it applies
    action: str = ""  # the vendor's recommended action (NVIDIA's catalog bucket: RESET_GPU...)
    source: str = ""  # where the code's meaning comes from


@dataclass(frozen=True)
class CodeTable:
    codes: dict[str, CodeInfo] = field(default_factory=dict)
    unknown_level: FaultLevel = FaultLevel.RESTART_BUSINESS
    escalation: Escalation = Escalation(times=3, window_s=86400.0)

    @classmethod
    def load(cls, override: Path | None = None) -> CodeTable:
        """The shipped table, with ``override`` (a user YAML file) merged over it."""
        text = resources.files("unbroken.faults").joinpath(_SHIPPED).read_text(encoding="utf-8")
        table = cls.parse(text, source=_SHIPPED)
        if override is not None:
            problems = Problems(override)
            user_text = document.read_text(override, problems)
            if user_text is None:
                (problem,) = problems.problems
                where = f"{override}:{problem.line}" if problem.line else f"{override}"
                raise CodeTableError(f"{where}: cannot read fault code table: {problem.message}")
            table = table.merged(_parse_parts(user_text, str(override)))
            logger.info("fault code table: %s merged over the shipped table", override)
        return table

    @classmethod
    def parse(cls, text: str, source: str) -> CodeTable:
        """A complete table from YAML text; ``source`` names it in errors."""
        return cls().merged(_parse_parts(text, source))

    def merged(self, parts: _Parts) -> CodeTable:
        return CodeTable(
            codes={**self.codes, **parts.codes},
            unknown_level=parts.unknown_level or self.unknown_level,
            escalation=parts.escalation or self.escalation,
        )

    def lookup(self, code: str) -> CodeInfo | None:
        return self.codes.get(code.strip().upper()) if code else None

    def kind_for(self, code: str) -> FaultKind:
        """The kind a health provider reports for ``code`` (``device`` when unlisted)."""
        info = self.lookup(code)
        return info.kind if info is not None else FaultKind.DEVICE

    def level_for(self, kind: FaultKind, code: str) -> FaultLevel:
        """The level of a fault of ``kind`` with ``code`` (rules in the module docstring)."""
        info = self.lookup(code) if kind in _DEVICE_KINDS else None
        if info is not None:
            level = info.level
        elif code and kind in (FaultKind.DEVICE, FaultKind.DEVICE_MEMORY, FaultKind.LINK):
            level = self.unknown_level
        else:
            level = DEFAULT_LEVELS[kind]
        if kind.seen_by_training:
            level = worst(level, FaultLevel.RESTART_BUSINESS)
        return level

    def judge(self, code: str) -> tuple[int, bool]:
        """What a health provider needs of a device code: its level's severity, and whether the
        device stays in service at that level (nothing to reset, isolate or keep work from)."""
        level = self.level_for(self.kind_for(code), code)
        in_service = level in (
            FaultLevel.NOT_HANDLE,
            FaultLevel.SUB_HEALTH,
            FaultLevel.RESTART_REQUEST,
            FaultLevel.RESTART_BUSINESS,
        )
        return level.severity, in_service

    def escalation_for(self, code: str) -> Escalation | None:
        """The escalation rule that applies to ``code``, or None when it never escalates."""
        if not code:
            return None
        info = self.lookup(code)
        if info is None:
            rule = self.escalation if self.unknown_level.stops_training else None
        elif info.escalation is not None:
            rule = info.escalation
        else:
            rule = self.escalation if info.level.stops_training else None
        return rule if rule is not None and rule.times > 0 else None


@dataclass(frozen=True)
class _Parts:
    codes: dict[str, CodeInfo]
    unknown_level: FaultLevel | None
    escalation: Escalation | None


def _parse_parts(text: str, source: str) -> _Parts:
    problems = Problems(Path(source))
    root = document.compose(text, problems)  # bounded: no alias bomb, no deep nesting
    if problems.problems:
        raise CodeTableError(str(SpecError(problems.problems)))
    if root is None:
        return _Parts({}, None, None)
    top = _mapping(root, source, "the file", {"unknown", "escalation", "codes"})
    unknown = _level(top["unknown"], source) if "unknown" in top else None
    escalation = _escalation(top["escalation"], source) if "escalation" in top else None
    codes: dict[str, CodeInfo] = {}
    if "codes" in top:
        codes_node = top["codes"]
        if not isinstance(codes_node, yaml.MappingNode):
            _fail(source, codes_node, "codes", "a mapping CODE: {level: ...}")
        for key, value in codes_node.value:
            code = _code(key, source)
            if code in codes:
                _fail(source, key, "duplicate code", "each code listed once")
            codes[code] = _code_info(value, source, code)
    return _Parts(codes, unknown, escalation)


def _code_info(node: yaml.Node, source: str, code: str) -> CodeInfo:
    fields = _mapping(
        node, source, f"code {code}", {"level", "kind", "what", "escalate", "action", "source"}
    )
    if "level" not in fields:
        _fail(source, node, f"code {code}", "a mapping with a 'level' key")
    kind = FaultKind.DEVICE
    if "kind" in fields:
        kind_node = fields["kind"]
        allowed = sorted(k.value for k in _DEVICE_KINDS)
        if _scalar(kind_node) not in allowed:
            _fail(source, kind_node, "kind", "one of " + ", ".join(allowed))
        kind = FaultKind(_scalar(kind_node))
    return CodeInfo(
        level=_level(fields["level"], source),
        kind=kind,
        what=_scalar(fields["what"]) if "what" in fields else "",
        escalation=_escalation(fields["escalate"], source) if "escalate" in fields else None,
        action=_scalar(fields["action"]) if "action" in fields else "",
        source=_scalar(fields["source"]) if "source" in fields else "",
    )


def _escalation(node: yaml.Node, source: str) -> Escalation:
    fields = _mapping(node, source, "escalation rule", {"times", "window_s"})
    for key in ("times", "window_s"):
        if key not in fields:
            _fail(source, node, "escalation rule", "both 'times' and 'window_s'")
    times_text, window_text = _scalar(fields["times"]), _scalar(fields["window_s"])
    if not times_text.isdigit():
        _fail(source, fields["times"], "times", "an integer >= 0 (0 turns the rule off)")
    try:
        window_s = float(window_text)
    except ValueError:
        window_s = -1.0
    if not window_s > 0 or window_s == float("inf"):
        _fail(source, fields["window_s"], "window_s", "a number of seconds > 0")
    return Escalation(times=int(times_text), window_s=window_s)


#: The reference's own spellings of two levels (its fault-code files and its ConfigMaps).
LEVEL_ALIASES = {
    "NotHandleFault": FaultLevel.NOT_HANDLE,
    "ManuallySeparateNPU": FaultLevel.MANUALLY_SEPARATE,
}


def _level(node: yaml.Node, source: str) -> FaultLevel:
    text = _scalar(node)
    if text in LEVEL_ALIASES:
        return LEVEL_ALIASES[text]
    if text not in {level.value for level in FaultLevel}:
        names = [level.value for level in FaultLevel] + list(LEVEL_ALIASES)
        _fail(source, node, "level", "one of " + ", ".join(names))
    return FaultLevel(text)


def _code(node: yaml.Node, source: str) -> str:
    code = _scalar(node).strip().upper()
    if not _CODE.fullmatch(code):
        _fail(source, node, "code", "a device fault code such as 80E01801 or XID-79")
    return code


def _mapping(node: yaml.Node, source: str, what: str, keys: set[str]) -> dict[str, yaml.Node]:
    if not isinstance(node, yaml.MappingNode):
        _fail(source, node, what, "a mapping")
    out: dict[str, yaml.Node] = {}
    for key_node, value in node.value:
        key = _scalar(key_node)
        if key not in keys:
            _fail(source, key_node, f"key in {what}", "one of " + ", ".join(sorted(keys)))
        out[key] = value
    return out


def _scalar(node: yaml.Node) -> str:
    # The raw text, so that 80818200 stays a code and is not read as an integer.
    return str(node.value) if isinstance(node, yaml.ScalarNode) else ""


def _fail(source: str, node: yaml.Node, what: str, expected: str) -> NoReturn:
    if isinstance(node, yaml.ScalarNode):
        value = repr(_scalar(node))
    else:
        value = "a list" if isinstance(node, yaml.SequenceNode) else "a mapping"
    raise CodeTableError(
        f"{source}:{node.start_mark.line + 1}: {what}: {value} is not valid; expected {expected}"
    )
