"""``unbroken run``: the job on the embedded cluster (:mod:`unbroken.cli.run`), or, when the
cluster YAML declares network planes, on a namespace host per node (:mod:`unbroken.cli.planes`).
"""

from __future__ import annotations

import argparse
import sys

from unbroken.cli import run as local
from unbroken.cli.planes import refusal, run_on_planes

add_parser = local.add_parser


def run(args: argparse.Namespace) -> int:
    try:
        inputs = local.read_inputs(args.job, args.cluster, args.chaos)
    except local.InputError as exc:
        return local.fail_input("run", exc)
    if not inputs.cluster.planes:
        return local.run(args, inputs)
    why = refusal(inputs.cluster)
    if why is not None:
        print(f"unbroken run: {why}", file=sys.stderr)
        return 1
    return run_on_planes(args, inputs)
