"""Timeouts, crashes, fresh workers and graceful shutdown, with real processes."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
from http_helpers import execute, get, module_program
from session_requests import create_session
from waiting import wait_until

SPAWNER = """
import os, subprocess, time
def spawn_and_hang(marker):
    child = subprocess.Popen(["sleep", "600"], start_new_session=True)
    with open(marker, "w") as f:
        f.write(f"{child.pid}\\n{os.getcwd()}\\n")
    print("about to hang", flush=True)
    while True:
        time.sleep(0.1)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.parametrize(
    "kcoral_server", [["--worker-termination-grace-seconds", "1"]], indirect=True
)
def test_a_timeout_kills_grandchildren_and_removes_the_workspace(kcoral_server, tmp_path) -> None:
    marker = tmp_path / "marker"
    program = module_program(SPAWNER, [("spawn_and_hang", [str(marker)])], timeout_seconds=1)
    response = execute(kcoral_server.url, program)
    assert response.status == 504
    assert response.body == {
        "status": "ERROR",
        "request_id": response.body["request_id"],
        "error": {"kind": "timeout", "message": response.body["error"]["message"]},
    }
    assert response.body["error"]["message"].startswith(
        "execution timed out after its deadline of 1 s (the program's timeout_seconds"
    )
    pid_text, workspace = marker.read_text().splitlines()
    assert wait_until(lambda: not _alive(int(pid_text)))
    assert not Path(workspace).exists()
    finished = [e for e in kcoral_server.events() if e["event"] == "request_finished"][-1]
    assert finished["finish_reason"] == "timeout" and finished["level"] == "WARNING"
    assert "about to hang" in finished["output_tail"]["stdout"]
    # The seat is respawned and serves the next request.
    again = execute(kcoral_server.url, module_program("def f():\n    return 1\n", [("f", [])]))
    assert again.body["status"] == "COMPLETED"
    retired = [e for e in kcoral_server.events() if e["event"] == "worker_retired"]
    assert retired[-1]["reason"] == "timeout"


CRASHER = """
import os
def value():
    return 7
def crash():
    print("last words", flush=True)
    os._exit(3)
"""


def test_a_crash_during_an_instruction_fails_it_and_the_seat_recovers(kcoral_server) -> None:
    program = module_program(CRASHER, [("value", []), ("crash", [])])
    response = execute(kcoral_server.url, program)
    body = response.body
    assert response.status == 200 and body["status"] == "FAILED"
    assert body["error"] == {
        "kind": "runtime",
        "message": "worker exited while executing the instruction: it exited with status 3",
        "instruction_index": 5,
        "instruction_op": "run",
        "instruction_id": "r1",
        "traceback": "",
    }
    assert body["results"] == {"value#0": {"type": "integer", "value": 7}}
    assert "last words" in body["stdout"]
    finished = [e for e in kcoral_server.events() if e["event"] == "request_finished"][-1]
    assert finished["finish_reason"] == "crashed" and finished["level"] == "ERROR"
    again = execute(kcoral_server.url, module_program(CRASHER, [("value", [])]))
    assert again.body["status"] == "COMPLETED"
    ready = [e for e in kcoral_server.events() if e["event"] == "worker_ready"]
    assert [e["generation"] for e in ready] == [1, 2]


PID = "import os\ndef pid():\n    return os.getpid()\n"


@pytest.mark.parametrize("kcoral_server", [["--max-requests-per-worker", "1"]], indirect=True)
def test_a_reuse_limit_of_one_gives_every_request_a_fresh_worker(kcoral_server) -> None:
    program = module_program(PID, [("pid", [])])
    pids = [execute(kcoral_server.url, program).body["results"]["pid#0"]["value"] for _ in range(3)]
    assert len(set(pids)) == 3
    retired = [e for e in kcoral_server.events() if e["event"] == "worker_retired"]
    assert [e["reason"] for e in retired] == ["request_limit"] * 3
    assert all(e["level"] == "INFO" for e in retired)
    # The replacement is out of request_capacity until it is ready, then back in.
    assert wait_until(
        lambda: get(kcoral_server.url, "/health").body["load"]["request_capacity"] == 1
    )


@pytest.mark.parametrize("kcoral_server", [["--max-requests-per-worker", "2"]], indirect=True)
def test_a_reuse_limit_of_two_keeps_the_worker_for_two_requests(kcoral_server) -> None:
    program = module_program(PID, [("pid", [])])
    pids = [execute(kcoral_server.url, program).body["results"]["pid#0"]["value"] for _ in range(4)]
    assert pids[0] == pids[1] != pids[2] == pids[3]


NAP = """
import time
def nap(marker, s):
    open(marker, "w").close()
    time.sleep(s)
    return s
"""


def test_shutdown_lets_a_running_request_finish_and_refuses_new_ones(
    kcoral_server, tmp_path
) -> None:
    marker = tmp_path / "started"
    result: list = []
    runner = threading.Thread(
        target=lambda: result.append(
            execute(kcoral_server.url, module_program(NAP, [("nap", [str(marker), 2])]))
        )
    )
    runner.start()
    assert wait_until(marker.exists)
    kcoral_server.process.send_signal(signal.SIGTERM)
    assert wait_until(lambda: "Shutdown requested" in kcoral_server.stderr())
    kcoral_server.process.send_signal(signal.SIGTERM)  # repeated signals do not force an exit
    refused = execute(kcoral_server.url, module_program(NAP, [("nap", [str(marker), 0])]))
    assert refused.status == 503
    assert refused.headers["Retry-After"] == "1"
    assert refused.body["error"] == {
        "kind": "busy",
        "message": "server saturated: the server is shutting down",
    }
    session = create_session(kcoral_server.url)
    assert session.status == 503
    assert session.body["error"]["message"] == "the server is shutting down"
    assert get(kcoral_server.url, "/health").body["load"]["request_capacity"] == 0
    runner.join()
    assert result[0].status == 200 and result[0].body["status"] == "COMPLETED"
    assert kcoral_server.process.wait(30) == 0
    stderr = kcoral_server.stderr()
    assert "Shutdown requested. Finishing remaining benchmarks: 1 left." in stderr
    assert "Finishing remaining benchmarks: 0 left." in stderr
    # the repeated signal is answered, where it printed nothing, as if the server hung
    pid = kcoral_server.process.pid
    assert (
        "kcoral server: SIGTERM again: already stopping, once the running programs finish "
        "(each within its own deadline); repeated signals do not hurry it: "
        f"kill -KILL {pid} ends it now, and them with it\n"
    ) in stderr
    names = [e["event"] for e in kcoral_server.events()]
    assert names.index("shutdown_started") < names.index("shutdown_waiting")
    assert names[-2:] == ["shutdown_complete", "server_stopped"]
    assert os.path.exists(kcoral_server.log_dir)


@pytest.mark.parametrize("kcoral_server", [["--worker-wait-timeout-seconds", "0.5"]], indirect=True)
def test_no_free_worker_within_the_wait_timeout_is_a_503(kcoral_server, tmp_path) -> None:
    marker = tmp_path / "started"
    busy = threading.Thread(
        target=lambda: execute(kcoral_server.url, module_program(NAP, [("nap", [str(marker), 3])]))
    )
    busy.start()
    assert wait_until(marker.exists)
    refused = execute(kcoral_server.url, module_program(NAP, [("nap", [str(marker), 0])]))
    busy.join()
    assert refused.status == 503 and refused.headers["Retry-After"] == "1"
    assert refused.body["error"] == {
        "kind": "busy",
        "message": "server saturated: no worker became free within "
        "--worker-wait-timeout-seconds (0.5 s)",
    }
    finished = [
        e for e in kcoral_server.events() if e.get("request_id") == refused.body["request_id"]
    ]
    assert finished[-1]["finish_reason"] == "no_worker"
