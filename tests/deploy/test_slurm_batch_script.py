"""``deploy/slurm/kcoral-node.sbatch`` run by bash outside Slurm, with the job's variables set
by hand and ``KCORAL_NODE_DRY_RUN=1`` (it prints the command it would exec, one argument a
line). The real run under Slurm is ``tests/deploy/test_slurm_nodes.py``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "kcoral-node.sbatch"


def run_script(tmp_path: Path, token_mode: int = 0o600, **variables: str):
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
        ["bash", str(SCRIPT)], env=environment, capture_output=True, text=True, timeout=30
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
