"""load_job: the seed's fields, the rules of DESIGN section 2, and one test per class of bad
input asserting the message (field, value, what is allowed, file and line)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unbroken.spec import JobKind, ReplicaType, SpecError, load_job, parse_job
from unbroken.spec.knobs import (
    FaultScheduling,
    Framework,
    ProcessRecover,
    RetryLevel,
    Strategy,
    SubHealthyStrategy,
)

pytestmark = pytest.mark.unit

BASE = """\
apiVersion: mindxdl.gitee.com/v1
kind: AscendJob
metadata:
  name: demo
  labels:
    fault-scheduling: "grace"
{labels}
  annotations:
    recover-strategy: "{strategy}"
{annotations}
spec:
  replicaSpecs:
    Master:
      replicas: 1
      template:
        spec:
{master_pod}
          containers:
            - name: ascend
              env:
                - name: MINDIO_WAIT_MINDX_TIME
                  value: "{wait}"
{env}
              command: ["torchrun", "--nproc_per_node=2", "--nnodes=$(NNODES)", "train.py"]
    Worker:
      replicas: 2
      template:
        spec:
          containers:
            - name: ascend
              env:
                - name: MINDIO_WAIT_MINDX_TIME
                  value: "{wait}"
{env}
              command: ["torchrun", "--nproc_per_node=2", "--nnodes=$(NNODES)", "train.py"]
"""


def job_text(**fields: str) -> str:
    values = {
        "labels": "",
        "strategy": "recover,dump",
        "annotations": "",
        "master_pod": "",
        "wait": "30",
        "env": "",
    }
    values.update(fields)
    return BASE.format(**values)


def write(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def errors(tmp_path: Path, text: str) -> list[str]:
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as err:
        load_job(path)
    lines = str(err.value).splitlines()
    assert all(line.startswith(f"{path}") for line in lines)
    return [line.removeprefix(f"{path}") for line in lines]


def test_valid_job_is_read_fully(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, job_text(labels='    subHealthyStrategy: "graceExit"')))
    assert (job.name, job.namespace, job.kind, job.framework) == (
        "demo",
        "default",
        JobKind.ASCEND_JOB,
        Framework.PYTORCH,
    )
    assert [r.type for r in job.replica_specs] == [ReplicaType.MASTER, ReplicaType.WORKER]
    assert (job.nodes, job.nproc_per_node, job.world_size) == (3, 2, 6)
    fh = job.fault_handling
    assert fh.strategies == (Strategy.RECOVER, Strategy.DUMP, Strategy.EXIT)
    assert fh.fault_scheduling is FaultScheduling.GRACE
    assert fh.process_recover is ProcessRecover.ON
    assert fh.sub_healthy is SubHealthyStrategy.GRACE_EXIT
    assert (fh.grace_s, fh.wait_reschedule_s, fh.decision_wait_s) == (900.0, 270.0, 30.0)
    assert (fh.max_restarts, fh.monitor_interval_s) == (32767, 5.0)
    worker = job.replica_specs[1]
    assert (worker.script, worker.script_args, worker.launcher.nnodes) == ("train.py", (), 3)
    assert job.warnings == ()


def test_strategies_come_in_fixed_priority_order(tmp_path: Path) -> None:
    text = job_text(strategy="exit, dump,recover ,retry,recover-in-place")
    job = load_job(write(tmp_path, text))
    assert job.fault_handling.strategies == (
        Strategy.RETRY,
        Strategy.RECOVER_IN_PLACE,
        Strategy.RECOVER,
        Strategy.DUMP,
        Strategy.EXIT,
    )


def test_env_knobs_are_read(tmp_path: Path) -> None:
    env = (
        "                - name: HCCL_OP_RETRY_ENABLE\n"
        '                  value: "L0:0, L1:1, L2:1"\n'
        "                - name: HCCL_OP_RETRY_PARAMS\n"
        '                  value: "MaxCnt:3, HoldTime:2000, IntervalTime:500"'
    )
    job = load_job(write(tmp_path, job_text(env=env, wait="120")))
    op = job.fault_handling.op_retry
    assert op.enabled == {RetryLevel.L1, RetryLevel.L2}
    assert (op.max_count, op.hold_s, op.interval_s) == (3, 2.0, 0.5)
    assert job.fault_handling.decision_wait_s == 120.0


_OP_RETRY_L1 = (
    '                - name: HCCL_OP_RETRY_ENABLE\n                  value: "L0:0, L1:1, L2:1"'
)
_TSP = '                - name: MS_ENABLE_TFT\n                  value: "{TSP:1}"'


@pytest.mark.parametrize(
    ("strategy", "env", "on"),
    [
        ("retry", _OP_RETRY_L1, True),  # the seed's PyTorch configuration
        ("retry,recover", _OP_RETRY_L1, True),
        ("retry", "", False),  # no operator retry between nodes
        ("recover", _OP_RETRY_L1, False),  # no online recovery
        ("retry", _OP_RETRY_L1.replace("L1:1", "L1:0"), False),
        ("recover", _TSP, True),  # the MindSpore switch, honoured for PyTorch too
    ],
)
def test_link_failover_is_on_with_the_seeds_configuration(
    tmp_path: Path, strategy: str, env: str, on: bool
) -> None:
    job = load_job(write(tmp_path, job_text(strategy=strategy, env=env)))
    assert job.fault_handling.link_failover is on


# --- bad input, one class per test ------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as err:
        load_job(tmp_path / "absent.yaml")
    assert str(err.value) == f"{tmp_path / 'absent.yaml'}: no such file"


def test_unreadable_directory(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as err:
        load_job(tmp_path)
    assert str(err.value) == f"{tmp_path}: is a directory, not a YAML file"


def test_empty_file(tmp_path: Path) -> None:
    assert errors(tmp_path, "") == [": the file is empty"]
    assert errors(tmp_path, "# only a comment\n\n") == [
        ": the file has no YAML document (only comments or blank lines)"
    ]


def test_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(b"kind: AscendJob\n\x00\x01\x02")
    with pytest.raises(SpecError) as err:
        load_job(path)
    assert str(err.value) == f"{path}: binary file (NUL byte at offset 16), not YAML text"
    path.write_bytes(b"kind: AscendJob\nname: \xff\xfe\n")
    with pytest.raises(SpecError) as err:
        load_job(path)
    assert str(err.value) == f"{path}:2: not UTF-8 text (byte 0xff at offset 22)"


def test_not_yaml(tmp_path: Path) -> None:
    (message,) = errors(tmp_path, "kind: AscendJob\nmetadata: [name: x\n")
    assert message.startswith(":3: not valid YAML: while parsing a flow sequence")
    (message,) = errors(tmp_path, "just some prose, not a job\n")
    assert message == (
        ":1: expected a job (a mapping with apiVersion, kind, metadata, spec), got a string"
    )


def test_several_documents(tmp_path: Path) -> None:
    (message,) = errors(tmp_path, "kind: AscendJob\n---\nkind: AscendJob\n")
    assert "not valid YAML: expected a single document in the stream" in message


def test_duplicate_keys(tmp_path: Path) -> None:
    text = job_text(labels='    fault-scheduling: "force"')
    assert errors(tmp_path, text) == [
        ":7: metadata.labels.fault-scheduling: duplicate key 'fault-scheduling' (first given on "
        "line 6); YAML would silently keep only the last one"
    ]


def test_wrong_types(tmp_path: Path) -> None:
    text = job_text(labels="    fault-retry-times: 3\n    pod-rescheduling: on").replace(
        "replicas: 2", "replicas: two"
    )
    assert errors(tmp_path, text) == [
        ":7: metadata.labels.fault-retry-times: must be a string, but YAML reads 3 as an "
        'integer; quote it ("3"): Kubernetes rejects non-string labels, annotations and env '
        "values",
        ":8: metadata.labels.pod-rescheduling: must be a string, but YAML reads on as a boolean; "
        'quote it ("on"): Kubernetes rejects non-string labels, annotations and env values',
        ":27: spec.replicaSpecs.Worker.replicas: expected a whole number: got 'two'; allowed: "
        "a whole number 1-10000",
    ]


def test_unknown_recover_strategy_token_is_an_error_not_dropped(tmp_path: Path) -> None:
    assert errors(tmp_path, job_text(strategy="recover,dmup")) == [
        ":9: metadata.annotations.recover-strategy: unknown recovery strategy: got 'dmup'; "
        "allowed: retry, recover-in-place, recover, elastic-training, dump, exit"
    ]


def test_unknown_label_values(tmp_path: Path) -> None:
    text = job_text(labels='    subHealthyStrategy: "hotswitch"').replace('"grace"', '"gentle"')
    messages = errors(tmp_path, text)
    assert messages[0] == (
        ":6: metadata.labels.fault-scheduling: unknown value: got 'gentle'; allowed: force, "
        "grace, off"
    )
    assert messages[1] == (
        ":7: metadata.labels.subHealthyStrategy: unknown value: got 'hotswitch'; allowed: "
        "ignore, graceExit, forceExit, hotSwitch"
    )


def test_out_of_range_numbers(tmp_path: Path) -> None:
    text = job_text(
        labels='    grace-over-time: "1"',
        annotations='    wait-reschedule-timeout: "300"',
        wait="0",
    )
    assert errors(tmp_path, text) == [
        ":7: metadata.labels.grace-over-time: grace-over-time is out of range: got '1'; "
        "allowed: a whole number 2-3600 s",
        ":10: metadata.annotations.wait-reschedule-timeout: wait-reschedule-timeout is out of "
        "range: got '300'; allowed: a whole number 30-270 s",
        ":22: spec.replicaSpecs.Master.template.spec.containers[0].env[MINDIO_WAIT_MINDX_TIME]: "
        "MINDIO_WAIT_MINDX_TIME is out of range: got '0'; allowed: a whole number 1-3600 s",
    ]


def test_no_progress_restarts_is_read_and_bounded(tmp_path: Path) -> None:
    assert load_job(write(tmp_path, job_text())).fault_handling.no_progress_restarts == 8
    text = job_text(annotations='    no-progress-restarts: "3"')
    assert load_job(write(tmp_path, text)).fault_handling.no_progress_restarts == 3
    assert errors(tmp_path, job_text(annotations='    no-progress-restarts: "0"')) == [
        ":10: metadata.annotations.no-progress-restarts: no-progress-restarts is out of range: "
        "got '0'; allowed: a whole number 1-1000"
    ]


def test_sizes_have_upper_bounds(tmp_path: Path) -> None:
    text = job_text().replace("replicas: 2", "replicas: 100000000000000000000")
    text = text.replace("--nproc_per_node=2", "--nproc_per_node=100000000000000000000")
    messages = errors(tmp_path, text)
    assert (
        ":26: spec.replicaSpecs.Worker.replicas: out of range: got 100000000000000000000; "
        "allowed: a whole number 1-10000"
    ) in messages, messages
    assert any(
        "--nproc_per_node: invalid value: got '100000000000000000000'; allowed: a whole "
        "number 1-1024" in m
        for m in messages
    ), messages


def test_malformed_op_retry_params(tmp_path: Path) -> None:
    env = '                - name: HCCL_OP_RETRY_PARAMS\n                  value: "MaxCnt:30"'
    (message, *_rest) = errors(tmp_path, job_text(env=env))
    assert message == (
        ":24: spec.replicaSpecs.Master.template.spec.containers[0].env[HCCL_OP_RETRY_PARAMS]: "
        "HCCL_OP_RETRY_PARAMS MaxCnt is 30, out of range: got 'MaxCnt:30'; allowed: MaxCnt 1-10"
    )


def test_several_errors_are_reported_together(tmp_path: Path) -> None:
    text = job_text(strategy="recover,bogus", wait="abc").replace("name: demo", "name: Demo_1")
    messages = errors(tmp_path, text)
    assert len(messages) == 3
    assert messages[0].startswith(":4: metadata.name: not a valid job name: got 'Demo_1'")
    assert "unknown recovery strategy: got 'bogus'" in messages[1]
    assert "MINDIO_WAIT_MINDX_TIME must be a whole number: got 'abc'" in messages[2]


# --- combinations --------------------------------------------------------------------------------


def test_force_with_host_network_is_rejected(tmp_path: Path) -> None:
    text = job_text(strategy="exit", master_pod="          hostNetwork: true").replace(
        '"grace"', '"force"'
    )
    assert errors(tmp_path, text) == [
        ":17: spec.replicaSpecs.Master.template.spec.hostNetwork: fault-scheduling 'force' "
        "cannot be used with hostNetwork: true (a pod deleted at once leaves its host port held "
        "until the node notices); use 'grace' or drop hostNetwork: got true"
    ]


def test_process_level_strategies_need_grace(tmp_path: Path) -> None:
    text = job_text().replace('"grace"', '"force"')
    assert errors(tmp_path, text) == [
        ":6: metadata.labels.fault-scheduling: recover-strategy recover,dump needs "
        "fault-scheduling 'grace' (healthy processes must get SIGTERM and time to save): got "
        "'force'; allowed: grace"
    ]


def test_grace_exit_needs_dump(tmp_path: Path) -> None:
    text = job_text(strategy="recover", labels='    subHealthyStrategy: "graceExit"')
    assert errors(tmp_path, text) == [
        ":7: metadata.labels.subHealthyStrategy: graceExit saves last words before leaving, so "
        "recover-strategy must include 'dump': got 'graceExit'"
    ]


def test_elastic_training_is_pytorch_only(tmp_path: Path) -> None:
    text = job_text(strategy="elastic-training", labels='    framework: "mindspore"', wait="60")
    assert errors(tmp_path, text) == [
        ":9: metadata.annotations.recover-strategy: elastic-training is PyTorch only; this "
        "job's framework is mindspore: got 'elastic-training'"
    ]


def test_taskd_off_with_a_recover_strategy_is_contradictory(tmp_path: Path) -> None:
    env = '                - name: TASKD_PROCESS_ENABLE\n                  value: "off"'
    (message,) = errors(tmp_path, job_text(env=env))
    assert message == (
        ":24: spec.replicaSpecs.Master.template.spec.containers[0].env[TASKD_PROCESS_ENABLE]: "
        "TASKD_PROCESS_ENABLE=off contradicts recover-strategy: the job would opt out of the "
        "recovery it asks for; remove it or set it to on: got 'off'; allowed: on"
    )


def test_watchdog_on_with_a_recover_strategy_is_rejected(tmp_path: Path) -> None:
    env = '                - name: HCCL_ASYNC_ERROR_HANDLING\n                  value: "1"'
    (message,) = errors(tmp_path, job_text(env=env))
    assert "HCCL_ASYNC_ERROR_HANDLING=1 makes the collective watchdog abort the process" in message


def test_pod_rescheduling_needs_fault_scheduling(tmp_path: Path) -> None:
    text = job_text(strategy="exit", labels='    pod-rescheduling: "on"').replace(
        '    fault-scheduling: "grace"\n', ""
    )
    (message,) = errors(tmp_path, text)
    assert message == (
        ":6: metadata.labels.pod-rescheduling: pod-rescheduling: on needs fault-scheduling "
        "'force' or 'grace' (without it no pod is rescheduled); allowed: set "
        "metadata.labels.fault-scheduling"
    )


def test_knobs_must_agree_between_pods(tmp_path: Path) -> None:
    text = job_text().replace('value: "30"', 'value: "45"', 1)
    (message,) = errors(tmp_path, text)
    assert "MINDIO_WAIT_MINDX_TIME differs between master ('45') and worker ('30')" in message


def test_user_process_recover_pause_is_honoured_with_a_warning(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, job_text(labels='    process-recover-enable: "pause"')))
    assert job.fault_handling.process_recover is ProcessRecover.PAUSE
    assert not job.fault_handling.process_level
    assert job.warnings == (
        f"{tmp_path / 'job.yaml'}:7: metadata.labels.process-recover-enable: 'pause' is "
        "honoured: the process-level strategies are skipped and faults go to pod/job "
        "rescheduling until it is set to 'on'",
    )


def test_elastic_agent_variable_is_sunset(tmp_path: Path) -> None:
    env = '                - name: ELASTIC_PROCESS_RECOVER_ENABLE\n                  value: "1"'
    job = load_job(write(tmp_path, job_text(env=env)))
    assert any(
        "Elastic Agent, which is sunset (removed in the release of 2026-12-30)" in w
        for w in job.warnings
    )


def test_short_decision_wait_with_elastic_training_warns(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, job_text(strategy="elastic-training")))
    assert any(
        "with elastic-training and no recover, set it to 60 or more" in w for w in job.warnings
    )


def test_max_restarts_zero_means_32767_under_process_recovery(tmp_path: Path) -> None:
    text = job_text().replace('"--nnodes=$(NNODES)"', '"--nnodes=$(NNODES)", "--max_restarts=0"')
    assert load_job(write(tmp_path, text)).fault_handling.max_restarts == 32767


def test_literal_node_rank_on_several_replicas_is_rejected(tmp_path: Path) -> None:
    text = job_text().replace('"--nnodes=$(NNODES)"', '"--nnodes=3", "--node_rank=1"')
    messages = errors(tmp_path, text)
    assert any("every Worker pod would claim node rank 1; use $NODE_RANK" in m for m in messages)


def test_nnodes_must_match_the_training_pods(tmp_path: Path) -> None:
    text = job_text().replace('"--nnodes=$(NNODES)"', '"--nnodes=4"')
    messages = errors(tmp_path, text)
    assert messages[0].endswith(
        "--nnodes: the job has 3 training pods: got '4'; allowed: 3 or MIN:3 with 1 <= MIN"
    )


def test_relative_script_resolves_next_to_the_job(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    job = load_job(write(tmp_path, job_text()))
    assert job.replica_specs[0].script == str(tmp_path / "train.py")
    other = tmp_path / "sub"
    other.mkdir()
    assert load_job(write(other, job_text())).replica_specs[0].script == "train.py"


def test_torch_distributed_launch_is_deprecated(tmp_path: Path) -> None:
    text = job_text().replace(
        '["torchrun", "--nproc_per_node=2", "--nnodes=$(NNODES)", "train.py"]',
        '["python", "-m", "torch.distributed.launch", "--nproc_per_node=2", "train.py"]',
    )
    job = load_job(write(tmp_path, text))
    assert job.replica_specs[0].launcher.nproc_per_node == 2
    assert any(
        "torch.distributed.launch is deprecated by PyTorch; use torchrun" in w for w in job.warnings
    )


def test_unbroken_launch_line(tmp_path: Path) -> None:
    text = job_text().replace(
        '["torchrun", "--nproc_per_node=2", "--nnodes=$(NNODES)", "train.py"]',
        '["unbroken", "launch", "--nproc-per-node=cpu", "--run-id=x", "train.py", "--steps=3"]',
    )
    job = load_job(write(tmp_path, text))
    launcher = job.replica_specs[1].launcher
    assert (launcher.nproc_per_node, launcher.options) == (1, (("run_id", "x"),))
    assert launcher.script_args == ("--steps=3",)


_SEED = Path(__file__).resolve().parents[2] / "fixtures" / "seed"
_SEED_LINES = {
    p.name: p.read_text().splitlines()
    for p in sorted(_SEED.glob("*.yaml"))
    if not p.name.endswith(".cluster.yaml")
}
_GARBAGE = [
    "",
    "  x: [1",
    "kind: 3",
    "    replicas: -1",
    "- a",
    "metadata: null",
    '"\\x00"',
    "    env: 5",
    "  recover-strategy: ,,",
    "    - name: RANK\n      value: '1'",
]


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(sorted(_SEED_LINES)),
    st.lists(st.tuples(st.integers(0, 80), st.sampled_from(_GARBAGE)), max_size=4),
)
def test_mangled_seed_jobs_load_or_fail_with_problems(
    name: str, edits: list[tuple[int, str]]
) -> None:
    lines = list(_SEED_LINES[name])
    for index, garbage in edits:
        lines[index % len(lines)] = garbage
    try:
        parse_job("\n".join(lines) + "\n", Path(name))
    except SpecError as err:
        assert err.problems
        assert all(p.message for p in err.problems)


BOMB = "".join(
    f"x{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]\n"
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("xa: &a [1, 2, 3, 4, 5, 6, 7, 8, 9]\n" + BOMB + "kind: *i\n", "aliases expand the file"),
        ("kind: " + "[" * 10000 + "]" * 10000 + "\n", ":1: nested deeper than 64 levels"),
        ("kind: &k [*k]\n", ":1: kind: an alias refers to a value that contains it"),
        (
            "".join(f"x{i}: &a{i} 1\ny{i}: *a{i}\n" for i in range(101)),
            ":202: more than 100 aliases (*a100)",
        ),
    ],
)
def test_hostile_yaml_is_refused_in_one_line(tmp_path: Path, text: str, message: str) -> None:
    (line,) = errors(tmp_path, text)
    assert message in line, line


def test_straggler_knobs_are_read_and_bounded(tmp_path: Path) -> None:
    fh = load_job(write(tmp_path, job_text())).fault_handling
    assert (fh.straggler_threshold_percent, fh.straggler_window, fh.straggler_hold_s) == (75, 5, 10)
    text = job_text(
        annotations='    straggler-threshold-percent: "60"\n'
        '    straggler-window-steps: "3"\n'
        '    straggler-hold-seconds: "2"'
    )
    fh = load_job(write(tmp_path, text)).fault_handling
    assert (fh.straggler_threshold_percent, fh.straggler_window, fh.straggler_hold_s) == (60, 3, 2)
    assert errors(tmp_path, job_text(annotations='    straggler-threshold-percent: "100"')) == [
        ":10: metadata.annotations.straggler-threshold-percent: straggler-threshold-percent is "
        "out of range: got '100'; allowed: a whole number 1-99 %"
    ]


@pytest.mark.parametrize("switch", ["--enable-hbmfault-repair", "--enable-worker-reboot"])
def test_a_process_level_switch_without_high_availability_is_refused(
    tmp_path: Path, switch: str
) -> None:
    text = job_text().replace('"train.py"]', f'"train.py", "{switch}"]')
    assert errors(tmp_path, text) == [
        f":{line}: spec.replicaSpecs.{kind}.template.spec.containers[0].command: {switch} "
        "without --enable-high-availability: it must be enabled together with "
        "--enable-high-availability (the fault fast recovery switch it builds on)"
        for line, kind in ((24, "Master"), (35, "Worker"))
    ]
    both = job_text().replace(
        '"train.py"]', f'"train.py", "--enable-high-availability", "{switch}"]'
    )
    assert load_job(write(tmp_path, both, "both.yaml")).warnings == ()


def test_a_job_without_an_ascend_container_is_warned_about(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, job_text().replace("- name: ascend", "- name: trainer")))
    assert [w.removeprefix(str(tmp_path / "job.yaml")) for w in job.warnings] == [
        f":{line}: spec.replicaSpecs.{kind}.template.spec.containers[0].name: no container is "
        "named 'ascend' (the name the reference's operator injects its environment into, 'do "
        "not modify'): the first, 'trainer', is taken as the training container"
        for line, kind in ((19, "Master"), (30, "Worker"))
    ]
