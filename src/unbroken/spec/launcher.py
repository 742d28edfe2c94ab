"""The launcher line inside a container's command: torchrun's arguments and the training script.

A pod's container runs a shell script (``command: [/bin/bash, -c]`` with the script in ``args``,
or ``args: [script]`` alone) or a plain argv (``command: [torchrun, ...]``). This module reads the
script the way a shell would, as far as it matters here:

- ``NAME=value`` and ``export NAME=value`` lines are variable assignments; ``$NAME``/``${NAME}``
  later in the script expand to them (also the container env, passed in, which Kubernetes also
  substitutes for ``$(NAME)``). Assignments to the operator's variables (``MASTER_ADDR``, ...)
  do not replace them: the operator's per-pod value stands. A variable that is the
  whole word expands with word splitting, so the seed's
  ``DISTRIBUTED_ARGS="--nproc_per_node $GPUS_PER_NODE ..."`` then ``torchrun $DISTRIBUTED_ARGS
  train.py`` works.
- Backslash-newline joins lines; ``#`` starts a comment; ``;``, ``&&``, ``||``, ``|`` separate
  commands; commands run in the background (``... &``, like the seed's TaskD manager) are not the
  launcher.

The launcher command is one of: ``torchrun ...``, ``python -m torch.distributed.run ...``,
``python -m torch.distributed.launch ...`` (deprecated by PyTorch), ``unbroken launch ...``,
``msrun ...``, a wrapper shell script given the training script among its arguments (the seed's
``bash scripts/train_start.sh /job/code /job/output pretrain_gpt.py --args...`` and
``bash scripts/msrun_launcher.sh "run_mindformer.py --config ..."``), or ``python train.py`` run
directly. Launcher options are accepted in both spellings (``--nproc_per_node`` and
``--nproc-per-node``) and both forms (``--opt value``, ``--opt=value``); an option the launcher
does not know is an error (torchrun would reject it too). A value that still names a variable
after expansion is fine when the operator injects that variable per pod (``$NODE_RANK``,
``$MASTER_ADDR``, ``$NNODES``, ...: see :data:`OPERATOR_VARIABLES`), and an error otherwise.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from enum import StrEnum

from unbroken.spec.problems import Problems


class LauncherKind(StrEnum):
    TORCHRUN = "torchrun"
    TORCH_RUN_MODULE = "python -m torch.distributed.run"
    TORCH_LAUNCH_MODULE = "python -m torch.distributed.launch"
    UNBROKEN = "unbroken launch"
    MSRUN = "msrun"
    WRAPPER = "wrapper script"
    PYTHON = "python"


#: Variables the operator injects into every pod (see ``unbroken.operator``); a launcher option
#: may refer to them and the plan fills in each pod's value.
OPERATOR_VARIABLES = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "GROUP_RANK",
        "NODE_RANK",
        "WORLD_SIZE",
        "NNODES",
        "MINDX_TASK_ID",
    }
)

# torchrun 2.x options (both spellings normalised to underscores).
_TORCHRUN_VALUES = frozenset(
    {
        "nnodes",
        "nproc_per_node",
        "rdzv_backend",
        "rdzv_endpoint",
        "rdzv_id",
        "rdzv_conf",
        "max_restarts",
        "monitor_interval",
        "start_method",
        "event_log_handler",
        "role",
        "log_dir",
        "redirects",
        "tee",
        "local_ranks_filter",
        "duplicate_stdout_filters",
        "duplicate_stderr_filters",
        "node_rank",
        "master_addr",
        "master_port",
        "local_addr",
        "logs_specs",
        "numa_binding",
        "signals_to_handle",
        "shutdown_timeout",
    }
)
_TORCHRUN_FLAGS = frozenset(
    {"standalone", "module", "no_python", "run_path", "virtual_local_rank", "use_env"}
)
_TORCHRUN_SHORT = {"-m": "module", "-r": "redirects", "-t": "tee"}
_UNBROKEN_VALUES = frozenset({"run_id"})  # ``unbroken launch`` options beyond torchrun's
_MSRUN_VALUES = frozenset(
    {
        "worker_num",
        "local_worker_num",
        "master_addr",
        "master_port",
        "node_rank",
        "log_dir",
        "join",
        "cluster_time_out",
        "bind_core",
        "sim_level",
        "sim_rank_id",
        "rank_table_file",
        "worker_log_name",
        "tail_worker_log",
    }
)

# $NAME, ${NAME}, and $(NAME): Kubernetes expands the last in command and args from the env.
_VAR = re.compile(
    r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|\(([A-Za-z_][A-Za-z0-9_]*)\)|([A-Za-z_][A-Za-z0-9_]*))"
)
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.DOTALL)
_SHELLS = frozenset({"bash", "sh", "zsh", "dash"})
_KEYWORDS = frozenset({"then", "else", "do", "{", "(", "!", "time"})
_PYTHON = re.compile(r"python(3(\.[0-9]+)?)?")


@dataclass(frozen=True)
class Word:
    text: str
    line: int


@dataclass(frozen=True)
class LauncherArgs:
    """The launcher line of a container, resolved as far as the spec allows.

    ``None`` for ``node_rank``, ``master_addr``, ``master_port`` means "not given literally: the
    operator supplies it per pod". ``given`` names the options that were written explicitly
    (underscore spelling), so defaults can be told apart from choices.
    """

    kind: LauncherKind | None = None
    nproc_per_node: int = 1
    nnodes: int = 1
    min_nnodes: int | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    max_restarts: int = 32767
    monitor_interval_s: float = 5.0
    script: str | None = None
    script_args: tuple[str, ...] = ()
    module: bool = False
    wrapper: str | None = None
    options: tuple[tuple[str, str], ...] = ()
    given: frozenset[str] = frozenset()
    line: int | None = None


@dataclass
class RawLaunch:
    """What the command text says, before defaults and job-wide checks (see ``job.py``)."""

    kind: LauncherKind | None = None
    options: dict[str, Word] = field(default_factory=dict)
    flags: set[str] = field(default_factory=set)
    script: str | None = None
    script_args: tuple[str, ...] = ()
    wrapper: str | None = None
    line: int | None = None
    exports: dict[str, Word] = field(default_factory=dict)


def _expand(text: str, variables: dict[str, str], depth: int = 0) -> str:
    def sub(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        if name in variables and depth < 8:
            return _expand(variables[name], variables, depth + 1)
        return match.group(0)

    return _VAR.sub(sub, text)


def _logical_lines(text: str, first_line: int) -> list[tuple[str, int]]:
    lines: list[tuple[str, int]] = []
    current = ""
    start = first_line
    for offset, physical in enumerate(text.split("\n")):
        if not current:
            start = first_line + offset
        if physical.endswith("\\") and not physical.endswith("\\\\"):
            current += physical[:-1] + " "
            continue
        current += physical
        lines.append((current, start))
        current = ""
    if current:
        lines.append((current, start))
    return lines


def _simple_commands(
    line: str, line_no: int, field_path: str, problems: Problems
) -> list[tuple[list[str], bool]]:
    """Split one logical line into simple commands; each with a 'runs in background' flag."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError as exc:
        problems.error(line_no, field_path, f"cannot read the shell command ({exc})", value=line)
        return []
    commands: list[tuple[list[str], bool]] = []
    current: list[str] = []
    for token in tokens:
        if token and set(token) <= set(";&|"):
            if current:
                commands.append((current, token == "&"))
            current = []
            continue
        current.append(token)
    if current:
        commands.append((current, False))
    return commands


def _is_launcher(words: list[str]) -> bool:
    if not words:
        return False
    head = words[0].rsplit("/", 1)[-1]
    if head in ("torchrun", "msrun"):
        return True
    if head == "unbroken" and len(words) > 1 and words[1] == "launch":
        return True
    if _PYTHON.fullmatch(head):
        return any(w.endswith(".py") for w in words[1:]) or "-m" in words[1:]
    if head.endswith(".sh"):
        return True
    if head in _SHELLS:
        return any(w.endswith(".sh") or _first_py(w) is not None for w in words[1:])
    return False


def _first_py(word: str) -> str | None:
    first = word.split()[0] if word.split() else ""
    return first if first.endswith(".py") else None


def read_command(
    command: list[Word],
    args: list[Word],
    env: dict[str, str],
    field_path: str,
    problems: Problems,
) -> RawLaunch:
    """Find and read the launcher line of a container (``command`` + ``args``)."""
    script, argv = _script_or_argv(command, args)
    variables = dict(env)
    candidates: list[tuple[list[Word], int]] = []
    exports: dict[str, Word] = {}
    if argv is not None:
        candidates.append((argv, argv[0].line if argv else 0))
    elif script is not None:
        for line, line_no in _logical_lines(script.text, script.line):
            for words, background in _simple_commands(line, line_no, field_path, problems):
                while words and words[0] in _KEYWORDS:
                    words = words[1:]
                exported = bool(words) and words[0] in ("export", "declare", "local", "readonly")
                body = words[1:] if exported else words
                assignments = [_ASSIGN.fullmatch(w) for w in body]
                if body and all(assignments):
                    for match in assignments:
                        assert match is not None
                        value = _expand(match.group(2), variables)
                        if match.group(1) not in OPERATOR_VARIABLES:
                            # The seed's rank-0 ``export MASTER_ADDR=${POD_IP}`` names the same
                            # address the operator injects; launcher options keep the reference.
                            variables[match.group(1)] = value
                        if exported:
                            exports[match.group(1)] = Word(value, line_no)
                    continue
                # VAR=x cmd ...: a one-command environment prefix.
                while body and _ASSIGN.fullmatch(body[0]):
                    body = body[1:]
                if background or not _is_launcher(body):
                    continue
                expanded: list[Word] = []
                for word in body:
                    whole = _VAR.fullmatch(word)
                    value = _expand(word, variables)
                    if whole and value != word:
                        expanded.extend(Word(w, line_no) for w in value.split())
                    else:
                        expanded.append(Word(value, line_no))
                candidates.append((expanded, line_no))
    raw = RawLaunch(exports=exports)
    if not candidates:
        return raw
    ranked = sorted(candidates, key=lambda c: _rank(c[0]))
    best = _rank(ranked[0][0])
    top = [c for c in ranked if _rank(c[0]) == best]
    if best == _RANK_BARE_WRAPPER:
        top = top[-1:]  # setup scripts come first; the last wrapper starts the training
    if len(top) > 1:
        lines = ", ".join(str(c[1]) for c in top)
        problems.error(
            top[1][1],
            field_path,
            f"found {len(top)} launcher commands (lines {lines}); a pod runs one",
        )
    chosen, line_no = top[0]
    raw.line = line_no
    _read_launcher(chosen, raw, variables, field_path, problems)
    return raw


_RANK_BARE_WRAPPER = 3


def _rank(words: list[Word]) -> int:
    """Which candidate is the launcher: a launcher proper, then a wrapper script given the
    training script, then ``python train.py``, then a wrapper script with no script visible."""
    head = words[0].text.rsplit("/", 1)[-1] if words else ""
    if head in ("torchrun", "msrun", "unbroken") or (
        _PYTHON.fullmatch(head) and "-m" in [w.text for w in words[1:3]]
    ):
        return 0
    if head in _SHELLS or head.endswith(".sh"):
        return 1 if any(_first_py(w.text) is not None for w in words[1:]) else _RANK_BARE_WRAPPER
    return 2


def _script_or_argv(command: list[Word], args: list[Word]) -> tuple[Word | None, list[Word] | None]:
    """Either the shell script text a container runs, or its argv."""
    if command and command[0].text.rsplit("/", 1)[-1] in _SHELLS:
        rest = command[1:] + args
        index = next((i for i, w in enumerate(rest) if w.text == "-c"), None)
        if index is not None:
            after = [w for w in rest[index + 1 :] if w.text != "--"]
            return (after[0] if after else None), None
        return None, command + args
    if command:
        return None, command + args
    if len(args) == 1:
        return args[0], None
    return None, (args or None)


def _read_launcher(
    words: list[Word],
    raw: RawLaunch,
    variables: dict[str, str],
    field_path: str,
    problems: Problems,
) -> None:
    head = words[0].text.rsplit("/", 1)[-1]
    rest = words[1:]
    if head == "torchrun":
        raw.kind = LauncherKind.TORCHRUN
    elif head == "msrun":
        raw.kind = LauncherKind.MSRUN
    elif head == "unbroken":
        raw.kind = LauncherKind.UNBROKEN
        rest = rest[1:]
    elif _PYTHON.fullmatch(head):
        while rest and rest[0].text.startswith("-") and rest[0].text != "-m":
            rest = rest[1:]  # python's own flags (-u, -O, ...)
        if len(rest) >= 2 and rest[0].text == "-m":
            module = rest[1].text
            rest = rest[2:]
            if module == "torch.distributed.run":
                raw.kind = LauncherKind.TORCH_RUN_MODULE
            elif module == "torch.distributed.launch":
                raw.kind = LauncherKind.TORCH_LAUNCH_MODULE
            elif module == "unbroken" and rest and rest[0].text == "launch":
                raw.kind = LauncherKind.UNBROKEN
                rest = rest[1:]
            else:
                raw.kind = LauncherKind.PYTHON
                raw.script = module
                raw.script_args = tuple(w.text for w in rest)
                raw.flags.add("module")
                return
        else:
            raw.kind = LauncherKind.PYTHON
            if rest:
                raw.script = rest[0].text
                raw.script_args = tuple(w.text for w in rest[1:])
            return
    else:
        raw.kind = LauncherKind.WRAPPER
        if head in _SHELLS:
            while rest and rest[0].text.startswith("-"):
                rest = rest[1:]  # the shell's own flags (-x, -e, ...)
            raw.wrapper = rest[0].text if rest else None
            rest = rest[1:]
        else:
            raw.wrapper = words[0].text
        for index, word in enumerate(rest):
            if _first_py(word.text) is not None:
                inner = word.text.split()
                raw.script = inner[0]
                raw.script_args = tuple(inner[1:]) + tuple(w.text for w in rest[index + 1 :])
                break
        return
    _read_options(rest, raw, field_path, problems)


def _read_options(words: list[Word], raw: RawLaunch, field_path: str, problems: Problems) -> None:
    msrun = raw.kind is LauncherKind.MSRUN
    values = _MSRUN_VALUES if msrun else _TORCHRUN_VALUES
    if raw.kind is LauncherKind.UNBROKEN:
        values = values | _UNBROKEN_VALUES
    flags = frozenset() if msrun else _TORCHRUN_FLAGS
    i = 0
    while i < len(words):
        word = words[i]
        text = word.text
        if not text.startswith("-") or text == "-":
            break
        if text == "--":
            i += 1
            break
        name, eq, value = text.partition("=")
        if name in _TORCHRUN_SHORT and not msrun:
            key = _TORCHRUN_SHORT[name]
        else:
            key = name.lstrip("-").replace("-", "_")
        if key in flags:
            raw.flags.add(key)
            i += 1
            continue
        if key not in values:
            allowed = ", ".join("--" + v for v in sorted(values | flags))
            problems.error(
                word.line,
                f"{field_path}: {raw.kind}",
                f"unknown {raw.kind} option {name!r}",
                allowed=allowed,
            )
            i += 1
            continue
        if not eq:
            if i + 1 >= len(words):
                problems.error(word.line, field_path, f"{raw.kind} option {name} needs a value")
                i += 1
                continue
            value = words[i + 1].text
            i += 1
        raw.options[key] = Word(value, word.line)
        i += 1
    rest = words[i:]
    if rest:
        raw.script = rest[0].text
        raw.script_args = tuple(w.text for w in rest[1:])
