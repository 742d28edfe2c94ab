"""``unbroken validate FILE... [--cluster FILE]``: check job YAMLs (and a cluster YAML).

Exit 0 when every file is valid, 1 when any is not (every problem on stderr, one per line as
``file:line: field: message``), 2 for usage errors. Warnings go to stderr too, prefixed
``warning:``; they do not change the exit code.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from unbroken.spec import SpecError, load_cluster, load_job


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="check job YAMLs (and a cluster YAML) and report every problem",
        description="Check job YAMLs against every rule of the job spec. Exit 0 when all are "
        "valid, 1 with every problem on stderr otherwise.",
    )
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE", help="job YAML")
    parser.add_argument(
        "--cluster", type=Path, metavar="FILE", help="cluster YAML to check alongside"
    )


def run(args: argparse.Namespace) -> int:
    failed = False
    cluster_reported = False
    for path in args.files:
        try:
            job = load_job(path)
        except SpecError as err:
            print(str(err), file=sys.stderr)
            failed = True
            continue
        warnings = list(job.warnings)
        if args.cluster is not None:
            try:
                cluster = load_cluster(args.cluster, job)
            except SpecError as err:
                # A problem of the cluster file alone is the same for every job: say it once.
                text = str(err)
                if not cluster_reported or str(path) in text:
                    print(text, file=sys.stderr)
                cluster_reported = True
                failed = True
                continue
            warnings.extend(w for w in cluster.warnings if w not in warnings)
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr)
        print(f"{path}: valid ({len(warnings)} warning{'s' if len(warnings) != 1 else ''})")
    return 1 if failed else 0
