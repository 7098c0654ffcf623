"""``--gpus`` names each physical GPU once (SERVER §2).

``--gpus 0,0`` used to start a server that counted GPU 0 as two GPUs (``/health``
``gpu_count`` 2, two seats both named ``gpu0/w0``), so a program or session asking for two
GPUs got the same one twice."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

RUN_SECONDS = 120.0


def test_a_gpu_id_given_twice_is_refused_in_one_line_before_any_worker_starts(
    tmp_path: Path,
) -> None:
    ready = tmp_path / "ready"
    argv = [sys.executable, "-m", "kcoral", "server", "--port", "0", "--ready-file", str(ready)]
    argv += ["--log-dir", str(tmp_path / "logs"), "--device", "fake-gpu"]
    argv += ["--fake-gpu-count", "2", "--gpus", "0,0"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCORAL_")}
    result = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=RUN_SECONDS
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.endswith("kcoral server: error: --gpus names GPU 0 twice\n")
    assert "worker_ready" not in result.stderr
    assert not ready.exists() and not (tmp_path / "logs").exists()
