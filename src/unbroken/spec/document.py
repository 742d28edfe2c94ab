"""A YAML file read into located values: every node knows its line and its field path.

PyYAML's ``safe_load`` forgets where values came from and silently keeps the last of two equal
keys. Here the file is composed into PyYAML's node graph and walked: each mapping, sequence and
scalar becomes a :class:`Map`, :class:`Seq` or :class:`Scalar` that carries its 1-based line and
its dotted field path, and a key given twice in one mapping is an error naming both lines.
Scalars keep their YAML type (``on`` unquoted is the boolean true in YAML 1.1, ``3`` an int) so
the loaders can say "quote it" where Kubernetes wants strings.

Everything that can go wrong while reading (missing file, unreadable, not UTF-8, NUL bytes, empty,
not YAML, several documents) is reported through :class:`~unbroken.spec.problems.Problems`,
never as a traceback.

Every YAML file Unbroken reads (the job, ``--cluster``, ``--chaos``, ``--codes``) comes through
here, and hostile input is bounded before it can cost memory or a traceback: at most
:data:`MAX_BYTES` of text, :data:`MAX_DEPTH` levels of nesting (PyYAML composes recursively),
:data:`MAX_ALIASES` aliases, and :data:`MAX_VALUES` values once aliases are expanded (a few
hundred bytes of nested aliases expand to billions of values: the "billion laughs").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from unbroken.spec.problems import Problems, describe

#: The largest YAML file read (job files are a few KiB).
MAX_BYTES = 1024 * 1024
#: The deepest nesting of mappings and lists (a job file needs about 12).
MAX_DEPTH = 64
#: Aliases (``*name``) in one file: enough for merge keys (``<<: *defaults``), not for a bomb.
MAX_ALIASES = 100
#: Values (scalars, mappings, lists) of a file once its aliases are expanded.
MAX_VALUES = 100_000


@dataclass(frozen=True)
class YamlNode:
    path: str
    line: int


@dataclass(frozen=True)
class Scalar(YamlNode):
    """A YAML scalar: ``value`` is str, int, float, bool or None; ``block`` is true for ``|``/``>``
    block scalars, whose text starts on the line after ``line``."""

    value: object
    block: bool = False
    text: str = ""  # the scalar as written (``on`` for the boolean true read from ``on``)

    @property
    def text_line(self) -> int:
        """The line of the scalar's first character of text."""
        return self.line + 1 if self.block else self.line


@dataclass(frozen=True)
class Seq(YamlNode):
    items: tuple[YamlNode, ...] = ()


@dataclass(frozen=True)
class Map(YamlNode):
    items: dict[str, YamlNode] = field(default_factory=dict)

    def get(self, key: str) -> YamlNode | None:
        return self.items.get(key)


def kind_name(node: YamlNode) -> str:
    """What a node is, in a user's words (for 'expected a mapping, got a list')."""
    if isinstance(node, Map):
        return "a mapping"
    if isinstance(node, Seq):
        return "a list"
    assert isinstance(node, Scalar)
    value = node.value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    return "a string"


def child_path(parent: str, key: str) -> str:
    return f"{parent}.{key}" if parent else key


def read_text(path: Path, problems: Problems) -> str | None:
    """The file's text, or None with a problem recorded (missing, unreadable, binary, empty)."""
    try:
        if path.is_dir():
            problems.error(None, "", "is a directory, not a YAML file")
            return None
        with path.open("rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        problems.error(None, "", "no such file")
        return None
    except OSError as exc:
        problems.error(None, "", f"cannot read the file ({exc.strerror or exc})")
        return None
    if len(data) > MAX_BYTES:
        problems.error(None, "", f"file is larger than {MAX_BYTES // (1024 * 1024)} MiB")
        return None
    if b"\x00" in data:
        offset = data.index(b"\x00")
        problems.error(None, "", f"binary file (NUL byte at offset {offset}), not YAML text")
        return None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        problems.error(
            line,
            "",
            f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
        )
        return None
    if not text.strip():
        problems.error(None, "", "the file is empty")
        return None
    return text


class _TooLarge(Exception):
    def __init__(self, line: int, path: str, problem: str) -> None:
        super().__init__(line, path, problem)
        self.line, self.path, self.problem = line, path, problem


def _prescan(text: str, problems: Problems) -> bool:
    """Check nesting and aliases on PyYAML's event stream (iterative: no recursion), before
    anything is composed. A syntax error is left to the composer, which reports it."""
    depth = aliases = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            line = event.start_mark.line + 1 if event.start_mark is not None else None
            if isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    problems.error(line, "", f"nested deeper than {MAX_DEPTH} levels")
                    return False
            elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
                depth -= 1
            elif isinstance(event, yaml.AliasEvent):
                aliases += 1
                if aliases > MAX_ALIASES:
                    problems.error(
                        line,
                        "",
                        f"more than {MAX_ALIASES} aliases (*{event.anchor}); write the values "
                        "out instead of repeating anchors",
                    )
                    return False
    except yaml.YAMLError:
        pass
    return True


def compose(text: str, problems: Problems) -> yaml.Node | None:
    """PyYAML's node graph of ``text`` (one document), after the bounds above; None with
    problems recorded when it is not YAML or is out of bounds, None alone when it has no
    document."""
    if not _prescan(text, problems):
        return None
    loader = yaml.SafeLoader(text)
    try:
        root: yaml.Node | None = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        what = exc.problem or "malformed YAML"
        if exc.context:
            what = f"{exc.context}, {what}"
        problems.error(line, "", f"not valid YAML: {what}")
        return None
    except yaml.YAMLError as exc:
        problems.error(None, "", f"not valid YAML: {exc}")
        return None
    finally:
        loader.dispose()
    return root


def parse(text: str, problems: Problems) -> YamlNode | None:
    """Compose ``text`` into located nodes; None with problems recorded if it is not YAML."""
    before = len(problems.problems)
    root = compose(text, problems)
    if root is None:
        if len(problems.problems) == before:
            problems.error(None, "", "the file has no YAML document (only comments or blank lines)")
        return None
    loader = yaml.SafeLoader("")
    try:
        return _walk(loader, root, "", problems, [MAX_VALUES])
    except _TooLarge as exc:
        problems.error(exc.line, exc.path, exc.problem)
        return None
    finally:
        loader.dispose()


def load(path: Path, problems: Problems) -> YamlNode | None:
    text = read_text(path, problems)
    if text is None:
        return None
    return parse(text, problems)


def _walk(
    loader: yaml.SafeLoader, node: yaml.Node, path: str, problems: Problems, budget: list[int]
) -> YamlNode:
    line = node.start_mark.line + 1
    budget[0] -= 1
    if budget[0] < 0:
        raise _TooLarge(
            line,
            path,
            f"aliases expand the file to more than {MAX_VALUES} values; write the values out "
            "instead of nesting aliases",
        )
    if path.count(".") + path.count("[") > MAX_DEPTH:  # only an alias inside its own anchor
        top = path.split(".")[0].split("[")[0]
        raise _TooLarge(line, top, "an alias refers to a value that contains it")
    if isinstance(node, yaml.ScalarNode):
        try:
            value = loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            problems.error(line, path, f"cannot read this value ({exc})", value=node.value)
            value = node.value
        if not isinstance(value, str | int | float | bool) and value is not None:
            # Timestamps and binary: keep the text as written; loaders check types.
            value = node.value
        return Scalar(
            path=path, line=line, value=value, block=node.style in ("|", ">"), text=node.value
        )
    if isinstance(node, yaml.SequenceNode):
        elements = tuple(
            _walk(loader, item, f"{path}[{i}]", problems, budget)
            for i, item in enumerate(node.value)
        )
        return Seq(path=path, line=line, items=elements)
    assert isinstance(node, yaml.MappingNode)
    explicit = sum(1 for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge")
    try:
        loader.flatten_mapping(node)  # YAML merge keys (<<): merged pairs come first
    except yaml.YAMLError as exc:
        problems.error(line, path, f"cannot merge keys ({exc})")
    merged = len(node.value) - explicit
    items: dict[str, YamlNode] = {}
    key_lines: dict[str, int] = {}
    from_merge: set[str] = set()
    for index, (key_node, value_node) in enumerate(node.value):
        key_line = key_node.start_mark.line + 1
        if not isinstance(key_node, yaml.ScalarNode):
            problems.error(key_line, path, "a mapping key must be a plain string")
            continue
        key = str(key_node.value)
        if index < merged:
            if key not in items:  # the first merged mapping wins, as YAML specifies
                from_merge.add(key)
                key_lines[key] = key_line
                items[key] = _walk(loader, value_node, child_path(path, key), problems, budget)
            continue
        if key in from_merge:  # an explicit key overrides a merged one
            from_merge.discard(key)
        elif key in items:
            problems.error(
                key_line,
                child_path(path, key),
                f"duplicate key {key!r} (first given on line {key_lines[key]}); "
                "YAML would silently keep only the last one",
            )
            continue
        key_lines[key] = key_line
        items[key] = _walk(loader, value_node, child_path(path, key), problems, budget)
    return Map(path=path, line=line, items=items)


def as_map(node: YamlNode | None, problems: Problems) -> Map | None:
    """``node`` as a mapping; an error if it is something else (None passes through)."""
    if node is None or isinstance(node, Map):
        return node
    if isinstance(node, Scalar) and node.value is None:
        return Map(path=node.path, line=node.line)
    problems.error(node.line, node.path, f"expected a mapping, got {kind_name(node)}")
    return None


def as_seq(node: YamlNode | None, problems: Problems) -> Seq | None:
    if node is None or isinstance(node, Seq):
        return node
    if isinstance(node, Scalar) and node.value is None:
        return Seq(path=node.path, line=node.line)
    problems.error(node.line, node.path, f"expected a list, got {kind_name(node)}")
    return None


def as_str(node: YamlNode | None, problems: Problems, *, quote_hint: bool = False) -> str | None:
    """A string value. Kubernetes wants label, annotation and env values as strings, so with
    ``quote_hint`` an unquoted ``on``/``3``/``true`` is an error that says how to quote it."""
    if node is None:
        return None
    if isinstance(node, Scalar) and isinstance(node.value, str):
        return node.value
    if isinstance(node, Scalar) and quote_hint and node.value is not None:
        shown = node.text or describe(node.value)
        problems.error(
            node.line,
            node.path,
            f"must be a string, but YAML reads {shown} as {kind_name(node)}; quote it "
            f'("{shown}"): Kubernetes rejects non-string labels, annotations and env values',
            value=node.value,
            show_value=False,
        )
        return None
    problems.error(node.line, node.path, f"expected a string, got {kind_name(node)}")
    return None


def as_int(
    node: YamlNode | None, problems: Problems, low: int, high: int | None = None
) -> int | None:
    if node is None:
        return None
    allowed = f"a whole number {low}-{high}" if high is not None else f"a whole number >= {low}"
    if not isinstance(node, Scalar) or isinstance(node.value, bool):
        problems.error(
            node.line, node.path, f"expected a whole number, got {kind_name(node)}", allowed=allowed
        )
        return None
    value = node.value
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        value = int(value.strip())
    if not isinstance(value, int):
        problems.error(
            node.line, node.path, "expected a whole number", value=node.value, allowed=allowed
        )
        return None
    if value < low or (high is not None and value > high):
        problems.error(node.line, node.path, "out of range", value=value, allowed=allowed)
        return None
    return value


def as_bool(node: YamlNode | None, problems: Problems) -> bool | None:
    if node is None:
        return None
    if isinstance(node, Scalar) and isinstance(node.value, bool):
        return node.value
    if isinstance(node, Scalar) and node.value in ("true", "false"):
        return node.value == "true"
    problems.error(
        node.line,
        node.path,
        f"expected true or false, got {kind_name(node)}",
        value=node.value if isinstance(node, Scalar) else None,
        allowed="true, false",
    )
    return None
