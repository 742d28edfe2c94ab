"""``unbroken inject KIND``: a real fault into a running job, through its control plane.

Kinds: ``kill`` (SIGKILL a rank or every rank of a pod), ``exception`` (a Python exception
raised in the rank), ``hang`` (SIGSTOP), ``memory`` (a device memory error corrupts the rank's
state in its next step), ``link`` (the kernel resets the rank's TCP links to its peers, or with
``--peer P`` only the one to rank P), ``node`` (every process of a node dies at once),
``device`` (a device fault code through the ``sim`` health provider), ``sdc`` (silent data
corruption: a ``sim`` device computes wrong while its health stays good; only an online stress
test, ``unbroken stress-test``, finds it), ``throttle`` (a node's processes held to ``--cpu``
of one CPU by a cgroup quota, a straggler; ``--clear`` releases it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from unbroken.chaos import InjectKind
from unbroken.cli.control import call_run
from unbroken.cli.rundir import RunDirError, find_run


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("inject", help="inject a fault into a running job")
    kinds = [k.value for k in InjectKind if k is not InjectKind.STRESS_TEST]  # not a fault
    p.add_argument("kind", choices=kinds)
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--rank", type=int)
    target.add_argument("--pod")
    target.add_argument("--node")
    p.add_argument("--peer", type=int, default=None, help="link: only the link to this rank")
    p.add_argument("--device", type=int, default=None)
    p.add_argument("--code", default=None, help="device fault code, e.g. 80E3A201")
    p.add_argument("--cpu", type=float, default=None, help="throttle: share of one CPU (0.01-1)")
    p.add_argument(
        "--clear",
        action="store_true",
        help="device: the device reports healthy again; node: the lost node is back in the pool",
    )
    p.add_argument("--run", type=Path, default=None, help="run directory (default: newest)")


def run(args: argparse.Namespace) -> int:
    kind = InjectKind(args.kind)
    if kind is InjectKind.SDC and (args.device is None or args.node is None):
        print("unbroken inject: sdc needs --node and --device", file=sys.stderr)
        return 2
    if kind is InjectKind.THROTTLE and (args.cpu is None) != args.clear:
        print("unbroken inject: throttle needs one of --cpu or --clear", file=sys.stderr)
        return 2
    if args.cpu is not None and kind is not InjectKind.THROTTLE:
        print(f"unbroken inject: --cpu is for throttle, not {kind}", file=sys.stderr)
        return 2
    if kind in (InjectKind.NODE, InjectKind.DEVICE, InjectKind.THROTTLE) and args.node is None:
        print(f"unbroken inject: {kind} needs --node", file=sys.stderr)
        return 2
    if kind is InjectKind.DEVICE and (args.device is None or (args.code is None) != args.clear):
        print(
            "unbroken inject: device needs --device and one of --code or --clear", file=sys.stderr
        )
        return 2
    node_kinds = (InjectKind.NODE, InjectKind.DEVICE, InjectKind.SDC, InjectKind.THROTTLE)
    if kind not in node_kinds and args.node is not None:
        print(f"unbroken inject: {kind} targets --rank or --pod", file=sys.stderr)
        return 2
    if args.clear and kind not in (InjectKind.NODE, InjectKind.DEVICE, InjectKind.THROTTLE):
        print(
            f"unbroken inject: --clear is for node, device and throttle, not {kind}",
            file=sys.stderr,
        )
        return 2
    if kind is InjectKind.LINK and args.rank is None:
        print("unbroken inject: link needs --rank (and optionally --peer)", file=sys.stderr)
        return 2
    if args.peer is not None and kind is not InjectKind.LINK:
        print(f"unbroken inject: --peer is for link faults, not {kind}", file=sys.stderr)
        return 2
    try:
        run_dir = find_run(args.run)
    except RunDirError as exc:
        print(f"unbroken inject: {exc}", file=sys.stderr)
        return 1
    body = {
        "kind": kind.value,
        "rank": args.rank,
        "pod": args.pod,
        "node": args.node,
        "device": args.device,
        "code": args.code,
        "clear": args.clear,
        "peer": args.peer,
        "cpu": args.cpu,
    }
    reply = call_run("inject", run_dir, "Inject", body)
    if reply is None:
        return 1
    print(reply.get("detail", "injected"))
    return 0
