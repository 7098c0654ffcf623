"""`kcoral server` from the command line: the documented invocation and every option."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest
from e2e_support import module_program
from server_process import start_server
from waiting import wait_for

import kcoral

LISTENING = "KCoral server listening on http://"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_the_documented_cpu_command_line_starts_and_serves(tmp_path):
    port = free_port()
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    env.pop("KCORAL_AUTH_TOKEN", None)
    stderr_path = tmp_path / "stderr"
    command = [
        "kcoral", "server", "--device", "cpu", "--num-workers", "2", "--sandbox", "none",
        "--port", str(port), "--log-dir", "", "--max-requests-per-worker", "0",
    ]  # fmt: skip
    with open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=stderr, env=env, cwd=tmp_path
        )
    try:
        wait_for(
            lambda: LISTENING in stderr_path.read_text() or process.poll() is not None,
            "listening",
            60.0,
        )
        assert process.poll() is None, stderr_path.read_text()
        url = f"http://127.0.0.1:{port}"
        assert f"{LISTENING}127.0.0.1:{port}" in stderr_path.read_text()
        with kcoral.Client(url) as c:
            status = c.health()
            assert status["status"] == "ok" and status["gpu_count"] == 0
            assert status["target"] == {} and status["load"]["request_capacity"] == 2
            assert c.execute(module_program("def f():\n    return 'hi'\n", "f"))["out"] == "hi"
        assert not (tmp_path / "logs").exists()  # --log-dir '' disables file logging
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0


# Every option of SERVER.md §2 with a valid, non-default value (CPU mode).
ALL_OPTIONS = {
    "--host": "127.0.0.1",
    "--port": "0",
    "--device": "cpu",
    "--gpus": "0",
    "--num-workers": "1",
    "--workers-per-gpu": "2",
    "--max-requests-per-worker": "3",
    "--worker-termination-grace-seconds": "2",
    "--worker-wait-timeout-seconds": "100",
    "--default-timeout-seconds": "60",
    "--max-timeout-seconds": "120",
    "--max-request-bytes": "1000000",
    "--max-response-bytes": "1000000",
    "--output-limit-bytes": "7",
    "--max-output-limit-bytes": "2000",
    "--cache-capacity-bytes": "1000000",
    "--disk-cache-capacity-mbytes": "10",
    "--sandbox": "bubblewrap",
    "--sandbox-readonly-path": "/usr/share",
    "--router": "http://127.0.0.1:9",
    "--node-id": "e2e-node",
    "--node-token": "e2e-secret-token",
}
FLAGS = ["--no-log-console", "--no-log-programs"]
DOCUMENTED = {*ALL_OPTIONS, *FLAGS, "--disk-cache-dir", "--log-dir"}  # the §2 table rows


@pytest.mark.slow
def test_every_server_option_is_accepted_on_the_command_line(tmp_path):
    args = [item for pair in ALL_OPTIONS.items() for item in pair] + FLAGS
    args += ["--disk-cache-dir", str(tmp_path / "disk"), "--log-dir", str(tmp_path / "logs")]
    assert DOCUMENTED <= set(args), DOCUMENTED - set(args)
    server = start_server(tmp_path / "server", args, defaults=False)
    try:
        with kcoral.Client(server.url) as c:
            # A node's server answers only its router tunnel and supervisor (ROUTER §12,
            # issue 28): /health is refused to a stranger as a direct program is, so the
            # options' effect on a program is checked without the router.
            with pytest.raises(kcoral.KCoralError) as stranger:
                c.health()
            assert stranger.value.status_code == 401
            with pytest.raises(kcoral.KCoralError) as refused:
                c.execute(module_program("def f():\n    return 1\n", "f"))
            assert refused.value.status_code == 401
        assert "e2e-secret-token" not in server.stderr()
    finally:
        assert server.stop() == 0
    assert not list((tmp_path / "logs").glob("runs/*/programs/*.json"))  # --no-log-programs
    assert "request_finished" not in server.stderr()  # --no-log-console
    routed = {"--router", "--node-id", "--node-token"}
    direct_args = [item for o, v in ALL_OPTIONS.items() if o not in routed for item in (o, v)]
    direct_args += [*FLAGS, "--disk-cache-dir", str(tmp_path / "disk2"), "--log-dir", ""]
    direct = start_server(tmp_path / "direct", direct_args, defaults=False)
    try:
        with kcoral.Client(direct.url) as c:
            result = c.execute(module_program("def f():\n    print('0123456789')\n", "f"))
            assert result.completed, result.error
            assert (result.stdout, result.stdout_truncated) == ("0123456", True)
    finally:
        assert direct.stop() == 0


def test_an_invalid_option_value_exits_non_zero_before_starting(tmp_path):
    process = subprocess.run(
        [sys.executable, "-m", "kcoral", "server", "--device", "cpu", "--num-workers", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert process.returncode != 0 and "--num-workers" in process.stderr
    abbreviated = subprocess.run(
        [sys.executable, "-m", "kcoral", "server", "--dev", "cpu"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert abbreviated.returncode != 0
