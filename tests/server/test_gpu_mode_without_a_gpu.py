"""``kcoral server --device gpu`` on a machine where CUDA finds no GPU (a first try on a
laptop, or a CPU VM): the refusal says what to pass instead. Before, it read only
``kcoral server: start-up failed: GPU ids [0] are not available on this machine``."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

import pytest
from kcoral_server.gpu.inventory import DeviceError, choose_devices, probe_gpus

pytestmark = pytest.mark.timeout(120)


@pytest.mark.skipif(bool(probe_gpus(physical=True)), reason="CUDA finds a GPU here")
def test_gpu_mode_on_a_machine_without_a_gpu_says_to_run_on_the_cpu(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kcoral", "server", "--device", "gpu", "--port", "0",
         "--log-dir", "", "--disk-cache-dir", ""],
        capture_output=True, text=True, timeout=100, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "kcoral server: start-up failed: --device gpu: CUDA finds no GPU on this machine "
        "(--device cpu, or the default auto, runs programs on the CPU)"
    ), done.stderr


@pytest.mark.parametrize(
    ("stand_in", "why"),
    [
        ("raise RuntimeError('libcuda.so: cannot open')", "torch cannot be imported: libcuda.so"),
        ("import os; os._exit(3)", "exit status 3"),
    ],
    ids=["import-fails", "probe-dies"],
)
def test_gpu_mode_whose_gpu_probe_broke_says_the_probe_failed_not_that_there_is_no_gpu(
    tmp_path: Path, stand_in: str, why: str
) -> None:
    # The probe's failures read as an empty list: "CUDA finds no GPU on this machine (...
    # runs programs on the CPU)", on a GPU machine whose torch could not start (review).
    (tmp_path / "torch.py").write_text(stand_in + "\n")
    environ = {**os.environ, "PYTHONPATH": str(tmp_path)}
    with pytest.raises(DeviceError) as refused:
        choose_devices("gpu", [0], gpus_given=False, environ=environ)
    assert str(refused.value).startswith(f"--device gpu: the GPU probe failed: {why}")


def test_auto_mode_whose_gpu_probe_broke_runs_on_the_cpu_and_says_why(tmp_path: Path) -> None:
    # `--device auto` (the default) took a failed probe for "no GPU" and ran every program
    # on the CPU of a GPU machine without a word (review).
    (tmp_path / "torch.py").write_text("raise RuntimeError('libcuda.so: cannot open')\n")
    ready = tmp_path / "ready"
    server = subprocess.Popen(
        [sys.executable, "-m", "kcoral", "server", "--port", "0", "--log-dir", "",
         "--disk-cache-dir", "", "--ready-file", str(ready)],
        stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path[1:]])},
    )  # fmt: skip
    try:
        while not ready.exists():
            assert server.poll() is None, server.communicate()[1]
            select.select([], [], [], 0.05)
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=60)
    said = next(line for line in stderr.splitlines() if " gpu_probe_failed " in line)
    assert " WARNING " in said and "programs run on the CPU" in said, said
    assert "error=torch cannot be imported: libcuda.so: cannot open" in said, said
    assert "mode=cpu" in stderr
