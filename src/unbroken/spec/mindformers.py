"""MindFormers' model config, read where the seed sets what fault tolerance needs in it.

A MindFormers job runs ``run_mindformer.py --config <model>.yaml`` (through
``scripts/msrun_launcher.sh``). For process-level recovery the seed adds ``hccl_watchdog: False``
under ``context.ascend_config`` of that file: HCCL's watchdog otherwise ends a rank whose
collective failed before retry or last words can act. The file is looked for beside the job
YAML (the seed's paths are relative to the code directory the container ``cd``s into); found,
a watchdog left on is a warning naming the file and the key; not found, the warning says it was
not checked. The job is not refused: on hardware without HCCL the setting does nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import yaml

from unbroken.spec.problems import Problems
from unbroken.spec.replicas import RawReplica

KEY = "context.ascend_config.hccl_watchdog"


def config_path(script_args: Sequence[str]) -> str | None:
    """The value of ``--config`` among a MindFormers script's arguments."""
    for i, arg in enumerate(script_args):
        if arg == "--config" and i + 1 < len(script_args):
            return script_args[i + 1]
        if arg.startswith("--config="):
            return arg.removeprefix("--config=")
    return None


def watchdog(path: Path) -> object:
    """``context.ascend_config.hccl_watchdog`` of a MindFormers config (None: not set)."""
    doc = yaml.safe_load(path.read_text())
    node: object = doc
    for key in KEY.split("."):
        node = node.get(key) if isinstance(node, dict) else None
    return node


def check_mindformers_configs(
    source: Path, raws: Sequence[RawReplica], process_level: bool, problems: Problems
) -> None:
    """Warn, once per config file, where a MindSpore job with process-level rungs leaves HCCL's
    watchdog on, or where its config cannot be read here."""
    if not process_level:
        return
    seen: set[str] = set()
    for raw in raws:
        given = config_path(raw.launch.script_args)
        if given is None or given in seen:
            continue
        seen.add(given)
        path = Path(given) if Path(given).is_absolute() else source.parent / given
        where, field = raw.launch.line, f"{raw.path} --config {given}"
        try:
            value = watchdog(path)
        except FileNotFoundError:
            problems.warn(
                where,
                field,
                f"the MindFormers config is not beside the job ({path}), so {KEY} "
                "(False for process-level recovery, as the seed sets it) is not checked",
            )
            continue
        except (OSError, yaml.YAMLError) as exc:
            problems.warn(where, field, f"the MindFormers config cannot be read: {exc}")
            continue
        if value is not False:
            shown = "not set (on)" if value is None else repr(value)
            problems.warn(
                where,
                field,
                f"{KEY} is {shown}: HCCL's watchdog ends a rank whose collective failed before "
                "retry or last words can act; set it to False, as the seed does",
            )
