"""``deploy/slurm/kcoral-node.sbatch`` run by bash outside Slurm, with the job's variables set
by hand and ``KCORAL_NODE_DRY_RUN=1`` (it prints the command it would exec, one argument a
line). The real run under Slurm is ``tests/deploy/test_slurm_nodes.py``; docs/scaling.md
"Slurm" types what that test runs."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from kcoral_server.settings.command_line import parse_server_args
from slurm_cluster import NODE_OPTIONS, SlurmCluster

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "slurm" / "kcoral-node.sbatch"


def run_script(
    tmp_path: Path, token_mode: int = 0o600, arguments: tuple[str, ...] = (), **variables: str
):
    config = tmp_path / "home" / ".config" / "kcoral"
    config.mkdir(parents=True, exist_ok=True)
    for name, text in (("router-url", "http://router.example:9000\n"), ("node-token", "t0k\n")):
        (config / name).write_text(text)
        (config / name).chmod(0o600)
    (config / "node-token").chmod(token_mode)
    environment = {
        "HOME": str(tmp_path / "home"),
        "PATH": "/usr/bin:/bin",
        "KCORAL_NODE_DRY_RUN": "1",
        "SLURM_JOB_ID": "4711",
        **variables,
    }
    return subprocess.run(
        ["bash", str(SCRIPT), *arguments],
        env=environment,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_gpu_ranges_become_the_physical_ids_of_gpus_and_gpu_mode(tmp_path: Path) -> None:
    answer = run_script(tmp_path, SLURM_JOB_GPUS="0-2,5", KCORAL_GRES_TYPE="h100")
    command = answer.stdout.splitlines()
    assert answer.returncode == 0, answer.stderr
    assert command[command.index("--gpus") + 1] == "0,1,2,5"
    assert command[command.index("--device") + 1] == "gpu"
    assert "gres=h100" in command and "t0k" not in answer.stdout


def test_no_gpus_in_the_allocation_is_cpu_mode_without_gpus(tmp_path: Path) -> None:
    answer = run_script(tmp_path, SLURM_JOB_PARTITION="big mem!")
    command = answer.stdout.splitlines()
    assert answer.returncode == 0, answer.stderr
    assert command[command.index("--device") + 1] == "cpu" and "--gpus" not in command
    assert "partition=big-mem-" in command  # made a valid label value


def test_the_node_pins_the_bubblewrap_sandbox_unless_told_otherwise_after_the_script(
    tmp_path: Path,
) -> None:
    # `auto` would fall back to no sandbox with only a warning where bubblewrap cannot run,
    # and client programs would run unconfined, able to read the node token.
    pinned = parse_server_args(run_script(tmp_path).stdout.splitlines()[2:], {})
    assert pinned.config.sandbox == "bubblewrap"
    # The documented opt-out of the one-machine demo: options after the script come last.
    demo = run_script(tmp_path, arguments=NODE_OPTIONS).stdout.splitlines()
    assert demo[-len(NODE_OPTIONS) :] == list(NODE_OPTIONS)
    assert parse_server_args(demo[2:], {}).config.sandbox == "none"


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o602, 0o660])
def test_a_token_file_open_to_group_or_others_is_refused(tmp_path: Path, mode: int) -> None:
    answer = run_script(tmp_path, token_mode=mode)
    assert answer.returncode == 2 and answer.stdout == ""
    assert "open to group or others" in answer.stderr and "chmod 600" in answer.stderr


def test_outside_slurm_or_with_odd_gpu_ids_it_refuses(tmp_path: Path) -> None:
    outside = run_script(tmp_path, SLURM_JOB_ID="")
    assert outside.returncode == 2 and "run me with sbatch" in outside.stderr
    odd = run_script(tmp_path, SLURM_JOB_GPUS="0,gpu1")
    assert odd.returncode == 2 and "not GPU ids" in odd.stderr


def stand_in_scontrol(tmp_path: Path, time_limit: str) -> str:
    """A PATH whose ``scontrol show job`` says the job's ``TimeLimit`` as Slurm 22.05 does."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    scontrol = folder / "scontrol"
    scontrol.write_text(
        "#!/bin/bash\n"
        f"echo 'JobId=4711 JobName=kcoral-node'\n"
        f"echo '   RunTime=00:00:01 TimeLimit={time_limit} TimeMin=N/A'\n"
    )
    scontrol.chmod(0o755)
    return f"{folder}:/usr/bin:/bin"


@pytest.mark.parametrize("limit", ["00:02:00", "00:10:00"])
def test_a_time_limit_the_drain_signal_would_come_within_is_refused(
    tmp_path: Path, limit: str
) -> None:
    # Before, the job started, got its SIGTERM at once (#SBATCH --signal=B:TERM@600) and
    # left within seconds, COMPLETED, having served nothing and said nothing of why.
    answer = run_script(tmp_path, PATH=stand_in_scontrol(tmp_path, limit))
    assert answer.returncode == 2 and answer.stdout == ""
    assert "time limit" in answer.stderr and "--time=2:00:00" in answer.stderr


@pytest.mark.parametrize("limit", ["00:10:01", "1-00:00:00", "UNLIMITED"])
def test_a_time_limit_past_the_drain_signal_or_none_starts_the_node(
    tmp_path: Path, limit: str
) -> None:
    answer = run_script(tmp_path, PATH=stand_in_scontrol(tmp_path, limit))
    assert answer.returncode == 0 and "server" in answer.stdout.splitlines(), answer.stderr


def slurm_section() -> str:
    text = (ROOT / "docs" / "scaling.md").read_text()
    start = text.index("## Slurm\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def settings(lines: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in lines.splitlines() if "=" in line)
    return {key: value for key, value in pairs if " " not in key}


def test_the_docs_run_through_types_what_the_slurm_test_runs(tmp_path: Path) -> None:
    section = slurm_section()
    submit = f"sbatch $KCORAL_REPO/deploy/slurm/kcoral-node.sbatch {' '.join(NODE_OPTIONS)}"
    assert section.count(submit) == 2  # two node jobs
    assert "scancel --batch --signal=TERM $JOB" in section
    assert "--node-token-file" in section and '"slurm-*"' in section
    # The docs' slurm.conf uses the test's plugins (no cgroups) and daemons' user.
    docs = settings(section[section.index("<<CONF\n") : section.index("\nCONF\n")])
    cluster = SlurmCluster(tmp_path)
    cluster.write_files()
    test = settings(cluster.conf.read_text())
    for key in (
        "SlurmUser",
        "AuthType",
        "ProctrackType",
        "TaskPlugin",
        "JobAcctGatherType",
        "SelectType",
        "SelectTypeParameters",
        "SlurmdParameters",
    ):
        assert docs[key] == test[key], key


def test_the_docs_run_through_stops_what_it_started_by_pid_files_it_made() -> None:
    section = slurm_section()
    (stop,) = [line for line in section.splitlines() if line.startswith("kill ")]
    # The router has no pid file: it is the shell's background job.
    assert "$(jobs -p)" in stop
    pid_files = re.findall(r"\$S/[\w/]+\.pid", stop)
    assert sorted(pid_files) == ["$S/munge/munged.pid", "$S/slurmctld.pid", "$S/slurmd.pid"]
    for pid_file in pid_files:  # each written where the run-through tells the daemon to
        assert section.count(pid_file) >= 2, pid_file
