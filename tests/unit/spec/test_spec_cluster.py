"""load_cluster: defaults from the job, the mapping and args-string forms, and the checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from unbroken.spec import HotReset, JobSpec, SpecError, load_cluster, parse_job

pytestmark = pytest.mark.unit

JOB = """\
kind: AscendJob
metadata:
  name: c
  labels:
    fault-scheduling: "grace"
  annotations:
    recover-strategy: "{strategy}"
spec:
  replicaSpecs:
    Master:
      template:
        spec:
          containers:
            - command: ["torchrun", "--nproc_per_node=4", "train.py"]
    Worker:
      replicas: 2
      template:
        spec:
          containers:
            - command: ["torchrun", "--nproc_per_node=4", "train.py"]
"""


def job(strategy: str = "recover") -> JobSpec:
    return parse_job(JOB.format(strategy=strategy), Path("job.yaml"))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


def test_defaults_follow_the_job() -> None:
    cluster = load_cluster(None, job())
    assert (cluster.nodes, cluster.devices_per_node) == (4, 4)  # 3 nodes + 1 spare
    assert (cluster.hot_reset, cluster.list_watch_period_s, cluster.auto_stowing) == (
        HotReset.OFF,
        5.0,
        True,
    )
    assert cluster.warnings == ()


def test_mapping_form(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "nodes: 5\ndevicesPerNode: 8\ndevicePlugin:\n  hotReset: 2\n  listWatchPeriod: 30\n"
        "  autoStowing: false\n",
    )
    cluster = load_cluster(path, job())
    assert (cluster.nodes, cluster.devices_per_node, cluster.hot_reset) == (5, 8, HotReset.OFFLINE)
    assert (cluster.list_watch_period_s, cluster.auto_stowing) == (30.0, False)


def test_seed_args_string_form(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'devicePlugin: "device-plugin -useAscendDocker=true -volcanoType=true -autoStowing=false '
        '-listWatchPeriod 7 -hotReset=-1 -logFile=/var/log/dp.log -logLevel=0"\n',
    )
    cluster = load_cluster(path, job())
    assert (cluster.hot_reset, cluster.list_watch_period_s, cluster.auto_stowing) == (
        HotReset.OFF,
        7.0,
        False,
    )


def test_flags_hidden_behind_a_shell_comment_are_ignored_with_a_warning(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'devicePlugin:\n  args: [ "device-plugin -volcanoType=true  # Volcano is needed\n'
        '     -hotReset=2" ]\n',
    )
    cluster = load_cluster(path, job())
    assert cluster.hot_reset is HotReset.OFF
    assert cluster.warnings == (
        f"{path}:2: devicePlugin: text after '#' is a shell comment, so -hotReset=2 there is "
        "ignored; put each flag on its own line before any comment",
    )


def test_graceful_fault_tolerance_with_process_recovery_is_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, "devicePlugin:\n  hotReset: 1\n")
    with pytest.raises(SpecError) as err:
        load_cluster(path, job())
    assert str(err.value) == (
        f"{path}:2: devicePlugin.hotReset: graceful fault tolerance (hotReset=1) cannot be "
        "combined with process-level recovery (recover-strategy in job.yaml:7); the reference "
        "would silently fall back to job-level rescheduling: got 1; allowed: -1, or 2 (offline "
        "reset, made for process-level recovery)"
    )


def test_graceful_fault_tolerance_alone_is_sunset(tmp_path: Path) -> None:
    path = write(tmp_path, "devicePlugin:\n  hotReset: 1\n")
    cluster = load_cluster(path, job("exit"))
    assert cluster.hot_reset is HotReset.GRACEFUL
    assert any("hotReset=1 (graceful fault tolerance) is sunset" in w for w in cluster.warnings)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nodes: 2\n", ":1: nodes: the job needs 3 nodes: got 2; allowed: >= 3"),
        (
            "devicesPerNode: 2\n",
            ":1: devicesPerNode: the job runs 4 processes per node, one per device: got 2; "
            "allowed: >= 4",
        ),
        (
            "devicePlugin:\n  hotReset: 3\n",
            ":2: devicePlugin.hotReset: invalid hotReset: got 3; allowed: -1 (off), 0 "
            "(inference), 1 (graceful fault tolerance, sunset), 2 (offline)",
        ),
        (
            "devicePlugin:\n  listWatchPeriod: 2\n",
            ":2: devicePlugin.listWatchPeriod: out of range: got 2; allowed: a whole number 3-1800",
        ),
        (
            "devicePlugin:\n  autoStowing: maybe\n",
            ":2: devicePlugin.autoStowing: expected true or false, got a string: got 'maybe'; "
            "allowed: true, false",
        ),
        (
            "nodes: 100000000000000000000\n",
            ":1: nodes: out of range: got 100000000000000000000; allowed: a whole number 1-10000",
        ),
        (
            "devicesPerNode: 4096\n",
            ":1: devicesPerNode: out of range: got 4096; allowed: a whole number 1-1024",
        ),
        (
            "node: 3\n",
            ":1: node: unknown cluster key: got 'node'; allowed: nodes, "
            "devicesPerNode, devicePlugin",
        ),
        (
            'devicePlugin: "device-plugin -hotRest=1"\n',
            ":1: devicePlugin: -hotRest: unknown device plugin flag: got '-hotRest=1'",
        ),
    ],
)
def test_bad_cluster_files(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as err:
        load_cluster(path, job())
    assert str(err.value).startswith(f"{path}{message}")


def test_no_spare_node_for_recover_warns(tmp_path: Path) -> None:
    cluster = load_cluster(write(tmp_path, "nodes: 3\n"), job())
    assert any("no spare node" in w for w in cluster.warnings)


@pytest.fixture
def scripted_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML answers (tests/support/fakenvml, one GPU), as on a GPU machine."""
    import sys

    from tests.support import nvmlscript

    state = tmp_path / "nvml.json"
    nvmlscript.write_state(state, gpus=1)
    monkeypatch.setenv("FAKE_NVML_STATE", str(state))
    monkeypatch.setitem(sys.modules, "pynvml", nvmlscript.load("pynvml"))


@pytest.mark.usefixtures("scripted_nvml")
def test_nvml_with_a_reset_command(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "devicePlugin:\n  provider: nvml\n  hotReset: 2\n"
        "  resetCommand: nvidia-smi --gpu-reset -i {gpu}\n",
    )
    plugin = load_cluster(path, job()).device_plugin
    assert (plugin.provider, plugin.reset_command) == ("nvml", "nvidia-smi --gpu-reset -i {gpu}")


@pytest.mark.usefixtures("scripted_nvml")
@pytest.mark.parametrize(
    ("plugin", "message"),
    [
        ("  provider: nvml\n  hotReset: 2\n", "hotReset 2 on NVIDIA GPUs needs the command"),
        ("  provider: nvml\n  resetCommand: nvidia-smi -r\n", "names the GPU it resets"),
        ("  provider: dcgm\n", "unknown device health provider"),
    ],
)
def test_a_gpu_plugin_without_what_it_needs_is_refused(
    tmp_path: Path, plugin: str, message: str
) -> None:
    path = write(tmp_path, "devicePlugin:\n" + plugin)
    with pytest.raises(SpecError, match=message):
        load_cluster(path, job())
