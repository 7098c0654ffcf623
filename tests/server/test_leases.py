"""GPU leases with fake GPUs: real processes, real arbitration, no CUDA.

Order is proven with timestamps the programs write themselves (which interval came first),
and with the server's own lease counters, never with wall-clock thresholds.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from http_helpers import execute, get, module_program
from waiting import wait_for_file

FAKE_GPU = ["--device", "fake-gpu", "--fake-gpu-count", "1", "--workers-per-gpu", "2"]

WORK = """
import time
def work(log, marker, seconds):
    start = time.time()
    open(marker, "w").close()
    time.sleep(seconds)
    with open(log, "a") as f:
        f.write(f"{start} {time.time()}\\n")
    return seconds
def work_cpu(log, marker, seconds):
    return work(log, marker, seconds)
"""


def _in_background(url: str, program: dict) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(target=lambda: out.append(execute(url, program)))
    thread.start()
    return thread, out


def _intervals(log: Path) -> list[tuple[float, float]]:
    return sorted(tuple(map(float, line.split())) for line in log.read_text().splitlines())


@pytest.mark.parametrize("kcoral_server", [FAKE_GPU], indirect=True)
def test_a_fake_gpu_server_reports_one_gpu_and_an_arch(kcoral_server) -> None:
    health = get(kcoral_server.url, "/health").body
    assert health["gpu_count"] == 1 and health["target"] == {"arch": "sm_90a"}
    assert health["load"]["request_capacity"] == 2
    ready = [e for e in kcoral_server.events() if e["event"] == "worker_ready"]
    assert sorted(e["worker_id"] for e in ready) == ["gpu0/w0", "gpu0/w1"]


@pytest.mark.parametrize("kcoral_server", [FAKE_GPU], indirect=True)
def test_gpu_work_of_two_workers_never_overlaps_and_the_waiter_pays_in_lease_wait(
    kcoral_server, tmp_path
) -> None:
    log, first_marker = tmp_path / "log", tmp_path / "first"
    first, first_out = _in_background(
        kcoral_server.url, module_program(WORK, [("work", [str(log), str(first_marker), 1.0])])
    )
    wait_for_file(first_marker, 30.0)
    second_marker = tmp_path / "second"
    second = execute(
        kcoral_server.url, module_program(WORK, [("work", [str(log), str(second_marker), 0.1])])
    )
    first.join()
    (_a_start, a_end), (b_start, _b_end) = _intervals(log)
    assert a_end <= b_start  # the second ran only after the first finished
    body = second.body
    assert body["status"] == "COMPLETED"
    assert body["lease_wait_ms"] > body["queue_ms"]  # it had a worker, but waited for the GPU
    assert first_out[0].body["lease_held_ms"] > 0
    for response in (body, first_out[0].body):
        assert response["elapsed_ms"] >= response["lease_wait_ms"] + response["lease_held_ms"] - 1


@pytest.mark.parametrize("kcoral_server", [FAKE_GPU], indirect=True)
def test_a_cpu_only_run_lets_another_request_take_the_gpu(kcoral_server, tmp_path) -> None:
    cpu_log, gpu_log = tmp_path / "cpu-log", tmp_path / "gpu-log"
    cpu_marker = tmp_path / "cpu"
    cpu_thread, cpu_out = _in_background(
        kcoral_server.url,
        module_program(WORK, [("work_cpu", [str(cpu_log), str(cpu_marker), 1.5])]),
    )
    wait_for_file(cpu_marker, 30.0)
    gpu = execute(
        kcoral_server.url,
        module_program(WORK, [("work", [str(gpu_log), str(tmp_path / "gpu"), 0.1])]),
    )
    assert not cpu_log.exists()  # the GPU request finished while the cpu_only run still ran
    cpu_thread.join()
    assert gpu.body["status"] == cpu_out[0].body["status"] == "COMPLETED"
    [(cpu_start, cpu_end)] = _intervals(cpu_log)
    [(gpu_start, gpu_end)] = _intervals(gpu_log)
    assert cpu_start <= gpu_start and gpu_end <= cpu_end


HOG = """
import time
def hog(marker):
    open(marker, "w").close()
    while True:
        time.sleep(0.05)
"""


@pytest.mark.parametrize(
    "kcoral_server", [[*FAKE_GPU, "--worker-termination-grace-seconds", "1"]], indirect=True
)
def test_a_killed_holder_frees_its_gpu(kcoral_server, tmp_path) -> None:
    marker = tmp_path / "hog"
    hog_thread, hog_out = _in_background(
        kcoral_server.url, module_program(HOG, [("hog", [str(marker)])], timeout_seconds=1)
    )
    wait_for_file(marker, 30.0)
    waiter = execute(
        kcoral_server.url,
        module_program(WORK, [("work", [str(tmp_path / "l"), str(tmp_path / "m"), 0])]),
    )
    hog_thread.join()
    assert hog_out[0].status == 504
    assert waiter.body["status"] == "COMPLETED"
    assert waiter.body["lease_wait_ms"] > 0


@pytest.mark.parametrize("kcoral_server", [FAKE_GPU], indirect=True)
def test_waiting_for_the_lease_does_not_count_against_the_timeout(kcoral_server, tmp_path) -> None:
    marker = tmp_path / "holder"
    holder_thread, holder_out = _in_background(
        kcoral_server.url,
        module_program(WORK, [("work", [str(tmp_path / "log"), str(marker), 2.5])]),
    )
    wait_for_file(marker, 30.0)
    waiter = execute(
        kcoral_server.url,
        module_program(
            WORK, [("work", [str(tmp_path / "log"), str(tmp_path / "w"), 0])], timeout_seconds=1
        ),
    )
    holder_thread.join()
    assert holder_out[0].body["status"] == "COMPLETED"
    assert waiter.status == 200 and waiter.body["status"] == "COMPLETED"
    # It waited longer than its whole timeout, and that was not held against it.
    assert waiter.body["lease_wait_ms"] > 1000


ENV = """
import os
def visible():
    return os.environ.get("CUDA_VISIBLE_DEVICES")
def pid():
    return os.getpid()
"""


@pytest.mark.parametrize(
    "kcoral_server",
    [["--device", "fake-gpu", "--fake-gpu-count", "2", "--workers-per-gpu", "1"]],
    indirect=True,
)
def test_a_gpu_count_program_runs_once_in_a_transient_worker_with_a_gpu_set(kcoral_server) -> None:
    seat_pid = execute(kcoral_server.url, module_program(ENV, [("pid", [])])).body
    program = module_program(ENV, [("visible", []), ("pid", [])], gpu_count=2)
    body = execute(kcoral_server.url, program).body
    assert body["status"] == "COMPLETED", body
    assert body["gpu_ids"] == [0, 1] and body["gpu_count"] == 2
    assert body["results"]["visible#0"]["value"] == "0,1"
    assert body["results"]["pid#1"]["value"] != seat_pid["results"]["pid#0"]["value"]
    too_many = execute(kcoral_server.url, {**program, "options": {"gpu_count": 3}})
    assert too_many.status == 400
    again = execute(kcoral_server.url, module_program(ENV, [("pid", [])])).body
    assert again["status"] == "COMPLETED"
    assert get(kcoral_server.url, "/health").body["load"]["requests_in_progress"] == 0
