"""The launcher line inside a container command: every launcher form of the seed."""

from __future__ import annotations

from pathlib import Path

import pytest

from unbroken.spec.launcher import LauncherKind, RawLaunch, Word, read_command
from unbroken.spec.problems import Problems

pytestmark = pytest.mark.unit

SHELL = [Word("/bin/bash", 1), Word("-c", 1), Word("--", 1)]


def read(script: str, env: dict[str, str] | None = None) -> tuple[RawLaunch, Problems]:
    problems = Problems(Path("job.yaml"))
    raw = read_command(SHELL, [Word(script, 10)], env or {}, "args", problems)
    return raw, problems


def options(raw: RawLaunch) -> dict[str, str]:
    return {k: w.text for k, w in raw.options.items()}


def test_seed_distributed_args_expand_into_torchrun() -> None:
    raw, problems = read(
        "GPUS_PER_NODE=8\n"
        'DISTRIBUTED_ARGS="--nproc_per_node $GPUS_PER_NODE --nnodes $NNODES --node_rank '
        '$NODE_RANK --master_addr $MASTER_ADDR --master_port $MASTER_PORT  --max_restarts 32767"\n'
        "torchrun $DISTRIBUTED_ARGS pretrain_gpt.py \\\n  --lr 0.1 \\\n  --seq-length 4096\n"
    )
    assert not problems
    assert raw.kind is LauncherKind.TORCHRUN
    assert options(raw) == {
        "nproc_per_node": "8",
        "nnodes": "$NNODES",
        "node_rank": "$NODE_RANK",
        "master_addr": "$MASTER_ADDR",
        "master_port": "$MASTER_PORT",
        "max_restarts": "32767",
    }
    assert raw.script == "pretrain_gpt.py"
    assert raw.script_args == ("--lr", "0.1", "--seq-length", "4096")
    assert raw.line == 12


def test_seed_train_start_wrapper_gives_the_training_script() -> None:
    raw, _ = read(
        "cd /job/code\nbash scripts/train_start.sh /job/code /job/output pretrain_gpt.py \\\n"
        "  --tensor-model-parallel-size 1 --enable-high-availability\n"
    )
    assert raw.kind is LauncherKind.WRAPPER
    assert raw.wrapper == "scripts/train_start.sh"
    assert raw.script == "pretrain_gpt.py"
    assert raw.script_args == ("--tensor-model-parallel-size", "1", "--enable-high-availability")


def test_seed_msrun_launcher_with_the_script_in_one_argument() -> None:
    raw, _ = read(
        'cd /job/code/;bash scripts/msrun_launcher.sh "run_mindformer.py --config '
        'configs/qwen3/pretrain_qwen3_32b_4k.yaml --run_mode train"'
    )
    assert raw.wrapper == "scripts/msrun_launcher.sh"
    assert raw.script == "run_mindformer.py"
    assert raw.script_args == (
        "--config",
        "configs/qwen3/pretrain_qwen3_32b_4k.yaml",
        "--run_mode",
        "train",
    )


def test_seed_wrapper_without_a_visible_script() -> None:
    raw, problems = read(
        "cd /job/code;\nchmod +x scripts/train_start.sh;\nbash scripts/train_start.sh\n"
    )
    assert not problems
    assert raw.kind is LauncherKind.WRAPPER
    assert raw.script is None


def test_background_taskd_manager_is_not_the_launcher() -> None:
    raw, problems = read(
        'if [[ "${RANK}" == 0 ]]; then\n    export MASTER_ADDR=${POD_IP}\n'
        "    python /job/code/manager.py 2>> /job/code/alllogs/$MINDX_TASK_ID/taskd/error.log &\n"
        "fi\ntorchrun --nproc_per_node 2 --master_addr $MASTER_ADDR train.py\n"
    )
    assert not problems
    assert raw.script == "train.py"
    assert options(raw)["master_addr"] == "$MASTER_ADDR"  # the operator's, not ${POD_IP}


@pytest.mark.parametrize(
    "line",
    [
        "torchrun --nproc-per-node=2 --max-restarts=3 --monitor-interval=1 train.py --x 1",
        "torchrun --nproc_per_node 2 --max_restarts 3 --monitor_interval 1 train.py --x 1",
        "python -m torch.distributed.run --nproc_per_node=2 --max_restarts=3 "
        "--monitor_interval=1 train.py --x 1",
        "python3 -u -m torch.distributed.run --nproc_per_node=2 --max_restarts=3 "
        "--monitor_interval=1 train.py --x 1",
        "unbroken launch --nproc_per_node=2 --max_restarts=3 --monitor_interval=1 train.py --x 1",
    ],
)
def test_both_spellings_and_all_torchrun_forms(line: str) -> None:
    raw, problems = read(line)
    assert not problems
    assert options(raw) == {"nproc_per_node": "2", "max_restarts": "3", "monitor_interval": "1"}
    assert (raw.script, raw.script_args) == ("train.py", ("--x", "1"))


def test_msrun_options() -> None:
    raw, _ = read("msrun --worker_num=8 --local_worker_num=2 --join=True run_mindformer.py --c x")
    assert raw.kind is LauncherKind.MSRUN
    assert options(raw) == {"worker_num": "8", "local_worker_num": "2", "join": "True"}
    assert raw.script == "run_mindformer.py"


def test_argv_command_with_kubernetes_variable_references() -> None:
    problems = Problems(Path("job.yaml"))
    command = [Word(w, 5) for w in ("torchrun", "--node_rank=$(NODE_RANK)", "--nnodes", "$(N)")]
    raw = read_command(command, [Word("train.py", 6)], {"N": "3"}, "command", problems)
    assert not problems
    assert options(raw) == {"node_rank": "$(NODE_RANK)", "nnodes": "$(N)"}
    assert raw.script == "train.py"


def test_unknown_torchrun_option_is_an_error() -> None:
    _, problems = read("torchrun --nproc_per_nod 2 train.py")
    (problem,) = problems.problems
    assert "unknown torchrun option '--nproc_per_nod'" in problem.message
    assert "--nproc_per_node" in (problem.allowed or "")
    assert problem.line == 10


def test_two_launchers_are_an_error() -> None:
    _, problems = read("torchrun train.py\ntorchrun other.py\n")
    (problem,) = problems.problems
    assert "found 2 launcher commands (lines 10, 11); a pod runs one" in problem.message


def test_unbalanced_quote_is_an_error() -> None:
    _, problems = read('torchrun "train.py\n')
    (problem,) = problems.problems
    assert "cannot read the shell command" in problem.message


def test_exports_are_reported_with_their_lines() -> None:
    raw, _ = read('cd /x\nexport HCCL_OP_RETRY_ENABLE="L0:0, L1:1, L2:1"\ntorchrun train.py\n')
    assert raw.exports["HCCL_OP_RETRY_ENABLE"] == Word("L0:0, L1:1, L2:1", 11)
