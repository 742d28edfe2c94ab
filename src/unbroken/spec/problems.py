"""Problems found in a spec file, and the error that carries them.

A :class:`Problem` names where (file and line), what (the field path, e.g.
``metadata.annotations.recover-strategy``), the value found and what is allowed. Loaders collect
every problem of a file before raising one :class:`SpecError`, so a user fixes them all in one
pass instead of one per run. ``str(err)`` renders one problem per line as
``file:line: field: message``, the format compilers use, so editors can jump to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Problem:
    """One thing wrong in a spec file. ``line`` is 1-based; ``None`` when not tied to a line."""

    file: Path
    line: int | None
    field: str
    value: str | None
    allowed: str | None
    message: str

    def render(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else f"{self.file}"
        field = f" {self.field}:" if self.field else ""
        return f"{where}:{field} {self.message}"


class SpecError(Exception):
    """A spec file (job or cluster YAML) is not valid; ``problems`` says everything wrong."""

    def __init__(self, problems: tuple[Problem, ...]) -> None:
        if not problems:
            raise ValueError("SpecError needs at least one problem")
        self.problems = problems
        super().__init__("\n".join(p.render() for p in problems))

    def __str__(self) -> str:
        return "\n".join(p.render() for p in self.problems)


def describe(value: object) -> str:
    """A value as a user wrote it, for messages: strings quoted, YAML types named."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value) if len(value) <= 80 else repr(value[:77] + "...")
    return str(value)


class Problems:
    """Collects problems and warnings for one file, then raises them all at once."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self._problems: list[Problem] = []
        self._warnings: list[str] = []

    def error(
        self,
        line: int | None,
        field: str,
        message: str,
        *,
        value: object = None,
        allowed: str | None = None,
        show_value: bool = True,
    ) -> None:
        """Record an error. ``message`` says what is wrong; the value and what is allowed are
        appended so every message names both (``...: got 'x'; allowed: a, b``)."""
        text = message
        shown = describe(value) if value is not None else None
        if shown is not None and show_value:
            text += f": got {shown}"
        if allowed is not None:
            text += f"; allowed: {allowed}"
        self._problems.append(
            Problem(
                file=self.file,
                line=line,
                field=field,
                value=shown,
                allowed=allowed,
                message=text,
            )
        )

    def warn(self, line: int | None, field: str, message: str) -> None:
        where = f"{self.file}:{line}" if line is not None else f"{self.file}"
        field_part = f" {field}:" if field else ""
        self._warnings.append(f"{where}:{field_part} {message}")

    @property
    def problems(self) -> tuple[Problem, ...]:
        return tuple(self._problems)

    @property
    def warnings(self) -> tuple[str, ...]:
        return tuple(self._warnings)

    def __bool__(self) -> bool:
        return bool(self._problems)

    def raise_if_any(self) -> None:
        if self._problems:
            raise SpecError(tuple(self._problems))
