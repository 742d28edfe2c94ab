"""``unbroken serve JOB.yaml --cluster CLUSTER.yaml --listen ADDR:PORT``: the control plane of a
job whose nodes are other hosts.

The same job manager as ``unbroken run``, listening where the user asks, with no embedded
cluster: the cluster's nodes are ``node-0`` .. ``node-N-1``, and each is a host whose agent joins
with ``unbroken launch --join ADDR:PORT --credentials node-I.json``. The token (the run's
secret) is written, mode 0600, to ``--token-file`` (default: ``token`` in the run directory);
with ``--secret-file F`` the token in ``F`` is used instead of a new one (the operator's
control-plane pod: the job's Secret, which its host pods mount too). The channel is mutual TLS
with the job's certificate authority beside the token (a new one beside a new token, the one
beside ``F``, made there when missing): the credentials of each node of the cluster are written
to ``RUN_DIR/hosts/NODE.json`` and the admin's to ``RUN_DIR/admin.json``
(:mod:`unbroken.cli.credentials`).
The rendezvous stores listen on the same address; torch's TCPStore has no authentication, so
that address must be one only the job's hosts reach (a private network).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable
from pathlib import Path

from unbroken.agent.remote import JoinError, read_token
from unbroken.cli.credentials import HOSTS_DIR, serve_credentials
from unbroken.cli.run import (
    InputError,
    Inputs,
    _terminate_as_interrupt,
    fail_input,
    read_inputs,
)
from unbroken.cli.rundir import RunDirError, check_own, claim_run_dir
from unbroken.faults import CodeTableError
from unbroken.ledger import Ledger, LedgerError
from unbroken.manager.console import Console
from unbroken.manager.layout import ClusterLayout, ManagerOptions
from unbroken.rpc import RpcError
from unbroken.rpc.tls import CredentialsError
from unbroken.spec import HotReset
from unbroken.spec.knobs import Framework

DEFAULT_PORT = 29400


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="the control plane of a job whose nodes are other hosts")
    p.add_argument("job", type=Path, help="the job YAML")
    p.add_argument("--cluster", type=Path, default=None, help="the cluster YAML")
    p.add_argument(
        "--listen",
        default=f"127.0.0.1:{DEFAULT_PORT}",
        metavar="ADDR:PORT",
        help=f"where the control plane listens (default 127.0.0.1:{DEFAULT_PORT})",
    )
    p.add_argument("--token-file", type=Path, default=None, help="default: RUN_DIR/token")
    p.add_argument(
        "--secret-file",
        type=Path,
        default=None,
        help="use the token in this file (mode 0600 or 0400) rather than making one",
    )
    p.add_argument("--chaos", type=Path, default=None, help="faults to inject (YAML)")
    p.add_argument("--run-dir", type=Path, default=None, help="default: runs/<job>-<time>")
    p.add_argument("--agent-timeout", type=float, default=2.0, help="s before a node is lost")
    p.add_argument("--hang-timeout", type=float, default=3.0, help="s of silence that is a hang")
    p.add_argument("--quiet", action="store_true", help="print only the summary")


def _fail(msg: str, prog: str = "serve") -> int:
    print(f"unbroken {prog}: {msg}", file=sys.stderr)
    return 1


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(f"--listen {text!r}: expected ADDR:PORT with a port from 1 to 65535")
    return host, int(port)


def write_token(path: Path, secret: str) -> None:
    """The token in a new file only its owner reads (0600 from its creation)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")


def run(
    args: argparse.Namespace,
    on_listening: Callable[[Path, Path, str], None] | None = None,
    inputs: Inputs | None = None,
) -> int:
    """``on_listening(run_dir, token, "ADDR:PORT")``, when given, is called once the control
    plane's credentials are written, before the job starts (``unbroken run`` on planes starts
    its namespace hosts' agents there); ``inputs``: read already (else they are read here)."""
    prog = getattr(args, "prog", "serve")  # `unbroken run` on planes runs as this command

    def fail(msg: str) -> int:
        return _fail(msg, prog)

    try:
        inputs = inputs or read_inputs(args.job, args.cluster, args.chaos)
    except InputError as exc:
        return fail_input(prog, exc)
    job, cluster, layout, nodes, chaos = (
        inputs.job,
        inputs.cluster,
        inputs.layout,
        inputs.nodes,
        inputs.chaos,
    )
    if cluster.device_plugin.provider == "nvml":
        where = f"{cluster.source}: " if cluster.source is not None else ""
        return fail(
            f"{where}devicePlugin.provider: nvml reads the GPUs of the machine it runs on, and "
            f"the nodes of `unbroken {prog}` are other hosts, whose agents do not report their "
            "GPUs' health; use provider sim here, or nvml with `unbroken run`"
        )
    if job.framework is Framework.MINDSPORE:
        return fail(
            f"{job.source}: metadata.labels.framework: mindspore: a MindSpore job runs on one "
            f"host here (`unbroken run` without planes), not across the hosts of `unbroken "
            f"{prog}`: its Scheduler runs beside node rank 0's ranks, and the ranks are given "
            "the control plane's address for it"
        )
    try:
        listen = _listen(args.listen)
    except ValueError as exc:
        return fail(str(exc))
    secret = None
    try:
        check_own(args.token_file, "--token-file", missing_ok=True)
        if args.secret_file is not None:
            check_own(args.secret_file, "--secret-file")
            secret = read_token(args.secret_file, "--secret-file")
    except (JoinError, RunDirError) as exc:
        return fail(str(exc))
    try:
        lock = claim_run_dir(job.name, args.run_dir)
    except RunDirError as exc:
        return fail(str(exc))
    from unbroken.manager.job import JobManager, ManagerError
    from unbroken.manager.service import NodeRegistry

    # Nodes are other hosts: no node image or warm spares on this one.
    os.environ["UNBROKEN_STANDBY"] = "0"
    with lock, _terminate_as_interrupt() as stopped_by:
        run_dir = lock.path
        layout = dataclasses.replace(layout, workdir=run_dir)
        cl = ClusterLayout(
            nodes=nodes,
            devices_per_node=cluster.devices_per_node,
            list_watch_period_s=cluster.list_watch_period_s,
            auto_stowing=cluster.auto_stowing,
            offline_reset=cluster.hot_reset is HotReset.OFFLINE,
            code_table=getattr(args, "codes", None),
        )
        opts = ManagerOptions(agent_timeout_s=args.agent_timeout, hang_startup_s=args.hang_timeout)
        console = Console(quiet=args.quiet)
        try:
            ledger = Ledger(run_dir / "ledger.db")
            manager = JobManager(layout, cl, run_dir, ledger, chaos, opts, console)
            manager.engine.listen = listen
            if secret is not None:
                manager.use_secret(secret)
            token = args.token_file or run_dir / "token"
            write_token(token, manager.secret)
            # Mutual TLS: the job's authority beside its token (a new one beside a new token),
            # and the control plane's, the admin's and every node's credentials from it.
            given = args.secret_file is not None
            tls = serve_credentials(
                token=args.secret_file if given else token,
                flag="--secret-file" if given else "--token-file",
                secret=manager.secret,
                fresh=not given,
                job=job.name,
                listen_host=listen[0],
                nodes=nodes,
                run_dir=run_dir,
            )
            manager.engine.remote_nodes = NodeRegistry(tls=tls)
        except (LedgerError, ManagerError, CodeTableError, OSError, CredentialsError) as exc:
            return fail(str(exc))
        if on_listening is not None:
            on_listening(run_dir, token, args.listen)
            console.line(f"run directory {run_dir}; control plane {args.listen}")
        else:
            console.line(
                f"run directory {run_dir}; token {token}; host I joins with: unbroken launch "
                f"--join {listen[0]}:{listen[1]} --credentials node-I.json (I = 0.."
                f"{cluster.nodes - 1}; copied from {run_dir / HOSTS_DIR})"
            )
        try:
            outcome = manager.run()
        except (ManagerError, CodeTableError, OSError, RpcError) as exc:
            return fail(str(exc))
        except KeyboardInterrupt as exc:
            fail(f"{stopped_by(exc)}; every process of the run was stopped")
            return stopped_by.exit_code
        finally:
            ledger.close()
        print(
            f"\njob {layout.job_id}: {'SUCCEEDED' if outcome.succeeded else 'FAILED'} "
            f"after {outcome.elapsed_s:.1f} s; step {outcome.step}; {outcome.faults} fault(s), "
            f"{outcome.recoveries} recovery(ies)"
        )
        if not outcome.succeeded:
            print(f"reason: {outcome.reason}", file=sys.stderr)
        return 0 if outcome.succeeded else 1
