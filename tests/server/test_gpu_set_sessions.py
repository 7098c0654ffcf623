"""Sessions pinned to more than one GPU (EXTENSIONS §11), with fake GPUs in real processes:
the session's worker sees its whole set, keeps its state, and each of its programs holds the
lease on the whole set, so a stateless program on any GPU of the set never runs during one."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from http_helpers import Response, get, module_program, request
from kcoral_server.pool.handles import HandleMaker
from kcoral_server.pool.seat import GpuDevice, Seat
from kcoral_server.sessions.registry import least_used_gpus
from metrics_support import scrape
from session_requests import create_session, run_in, value_of

TWO_FAKE_GPUS = ["--device", "fake-gpu", "--fake-gpu-count", "2", "--workers-per-gpu", "1"]

STATE = """
import json, os
import kcoral.session as session
def put(key, value):
    session.namespace[key] = value
    return json.dumps([os.getpid(), os.environ.get("CUDA_VISIBLE_DEVICES")])
def take(key):
    return json.dumps([os.getpid(), session.namespace.get(key)])
"""

WORK = """
import os, time
def work(log, who, seconds):
    start = time.time()
    time.sleep(seconds)
    with open(log, "a") as f:
        f.write(f"{who} {start} {time.time()} {os.environ.get('CUDA_VISIBLE_DEVICES')}\\n")
    return seconds
"""


# ---------------------------------------------------------------- the choice of the set


def test_a_new_session_takes_the_gpus_pinned_to_the_fewest_sessions_lowest_ids_first() -> None:
    assert least_used_gpus([0, 1, 2], [], 2) == [0, 1]
    assert least_used_gpus([0, 1, 2], [[0, 1]], 2) == [0, 2]
    assert least_used_gpus([0, 1, 2], [[0, 1], [0, 2]], 1) == [1]
    assert least_used_gpus([0, 1, 2], [[0, 1], [0, 2]], 3) == [0, 1, 2]
    # the set comes back in --gpus order (the order its programs see), not by load
    assert least_used_gpus([3, 1, 2], [[1]], 2) == [3, 2]
    # a set naming a GPU the server no longer lists counts nowhere
    assert least_used_gpus([0, 1], [[7]], 1) == [0]
    # among GPUs pinned to as many sessions, the least busy now (lease held or waited for)
    assert least_used_gpus([0, 1, 2], [], 1, {0: 1, 1: 0, 2: 2}) == [1]
    assert least_used_gpus([0, 1, 2], [[1]], 1, {0: 3, 2: 1}) == [2]
    assert least_used_gpus([0, 1], [[1]], 1, {0: 5}) == [0]  # sessions count first


BLOCKS = """
import os, time
def hold(started, go):
    open(started, "w").close()
    while not os.path.exists(go):
        time.sleep(0.01)
    return os.environ.get("CUDA_VISIBLE_DEVICES")
"""


@pytest.mark.parametrize("kcoral_server", [TWO_FAKE_GPUS], indirect=True)
def test_a_new_session_goes_to_the_idle_gpu_not_to_one_a_program_holds(
    kcoral_server, tmp_path: Path
) -> None:
    # team soak: the session went to GPU 0 (fewest sessions, lowest id) while a 300 s
    # program held it and GPU 1 was idle, and its worker's start-up waited for that lease
    started, go = tmp_path / "started", tmp_path / "go"
    answers: list[Response] = []
    program = module_program(BLOCKS, [("hold", [str(started), str(go)])])
    holder = threading.Thread(
        target=lambda: answers.append(run_in(kcoral_server.url, None, program))
    )
    holder.start()
    try:
        for _ in range(3000):
            if started.exists():
                break
            threading.Event().wait(0.01)
        assert started.exists(), "the holding program never started"
        created = create_session(kcoral_server.url, gpu_count=1)
    finally:
        go.touch()
        holder.join()
    assert created.status == 201, created.body
    held = int(str(value_of(answers[0], "hold")))  # the GPU the program ran on
    assert created.body["gpu_ids"] == [1 - held]


def test_a_sessions_worker_is_built_for_its_whole_pinned_set_and_kept_between_programs() -> None:
    made: list[dict] = []
    maker = HandleMaker(
        make=lambda **kwargs: made.append(kwargs) or SimpleNamespace(**kwargs),
        mode="fake-gpu",
        config=SimpleNamespace(max_requests_per_worker=1, log_programs=False),
        events=None,
        arbiter=None,
        sandbox="bubblewrap",
        allowed_serialization=["json"],
        seats=2,
        on_gone=lambda handle: None,
    )
    seat = Seat("session/0123abcd", 1)
    maker.for_pinned_set(seat, [GpuDevice(1, "GPU-b"), GpuDevice(0, "GPU-a")])
    assert made[0]["gpu_ids"] == [1, 0] and made[0]["gpu_uuids"] == ["GPU-b", "GPU-a"]
    assert made[0]["transient"] is False and made[0]["seat_sandbox"] is seat.sandbox
    assert seat.sandbox is not None and seat.sandbox.gpu_ids == [1, 0]
    # one UUID unknown: the worker is pinned by ids alone (never a mix of both)
    maker.for_pinned_set(Seat("session/4567abcd", 0), [GpuDevice(0, "GPU-a"), GpuDevice(1)])
    assert made[1]["gpu_ids"] == [0, 1] and made[1]["gpu_uuids"] == []


# ---------------------------------------------------------------- real servers


@pytest.mark.parametrize("kcoral_server", [TWO_FAKE_GPUS], indirect=True)
def test_a_two_gpu_sessions_programs_see_both_gpus_and_keep_their_state(kcoral_server) -> None:
    url = kcoral_server.url
    created = create_session(url, gpu_count=2)
    assert created.status == 201, created.body
    record = created.body
    assert record["gpu_count"] == 2 and record["gpu_ids"] == [0, 1]
    sid = record["session_id"]
    pid, visible = value_of(run_in(url, sid, module_program(STATE, [("put", ["k", 41])])), "put")
    assert visible == "0,1"
    assert value_of(run_in(url, sid, module_program(STATE, [("take", ["k"])])), "take") == [pid, 41]
    # a program may repeat the session's count, never ask for another one
    same = module_program(STATE, [("take", ["k"])], gpu_count=2)
    assert value_of(run_in(url, sid, same), "take") == [pid, 41]
    other = run_in(url, sid, module_program(STATE, [("take", ["k"])], gpu_count=1))
    assert other.status == 400 and other.body["error"]["kind"] == "parse"
    assert "differs from this session's (2)" in other.body["error"]["message"]
    seats = get(url, "/internal/worker-status").body["session_seats"]
    assert [(s["session_id"], s["gpu_ids"], s["worker_pid"]) for s in seats] == [(sid, [0, 1], pid)]
    assert request(url, "DELETE", f"/v1/sessions/{sid}").status == 200


@pytest.mark.parametrize("kcoral_server", [TWO_FAKE_GPUS], indirect=True)
def test_a_two_gpu_sessions_program_counts_its_lease_on_both_gpus(kcoral_server) -> None:
    url = kcoral_server.url
    sid = create_session(url, gpu_count=2).body["session_id"]
    before = scrape(url)
    assert value_of(run_in(url, sid, module_program(STATE, [("put", ["k", 1])])), "put")
    after = scrape(url)
    for gpu in ("0", "1"):
        for series in ("kcoral_lease_held_seconds_count", "kcoral_lease_wait_seconds_count"):
            key = f'{series}{{gpu="{gpu}"}}'
            assert after.get(key, 0.0) - before.get(key, 0.0) == 1.0, (key, before, after)
    assert request(url, "DELETE", f"/v1/sessions/{sid}").status == 200


@pytest.mark.parametrize("kcoral_server", [TWO_FAKE_GPUS], indirect=True)
def test_a_stateless_program_on_a_gpu_of_the_set_never_holds_the_lease_during_a_session_program(
    kcoral_server, tmp_path: Path
) -> None:
    url = kcoral_server.url
    sid = create_session(url, gpu_count=2).body["session_id"]
    log = tmp_path / "log"
    answers: dict[str, Response] = {}
    start = threading.Barrier(3)

    def send(who: str, session_id: str | None) -> None:
        program = module_program(WORK, [("work", [str(log), who, 0.5])])
        start.wait()
        answers[who] = run_in(url, session_id, program)

    threads = [
        threading.Thread(target=send, args=("session", sid)),
        threading.Thread(target=send, args=("stateless-a", None)),
        threading.Thread(target=send, args=("stateless-b", None)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for who, answer in answers.items():
        assert answer.status == 200 and answer.body["status"] == "COMPLETED", (who, answer.body)
        assert answer.body["lease_held_ms"] > 0
    runs = {}
    for line in log.read_text().splitlines():
        who, began, ended, visible = line.split()
        runs[who] = (float(began), float(ended), visible)
    session_start, session_end, session_visible = runs.pop("session")
    assert session_visible == "0,1"
    stateless_gpus = set()
    for began, ended, visible in runs.values():
        assert ended <= session_start or session_end <= began  # never together
        stateless_gpus.add(int(visible))
    assert stateless_gpus <= {0, 1}  # each stateless program ran on a GPU of the set


@pytest.mark.parametrize("kcoral_server", [TWO_FAKE_GPUS], indirect=True)
def test_a_session_asking_for_more_gpus_than_the_server_has_is_refused_clearly(
    kcoral_server,
) -> None:
    url = kcoral_server.url
    too_many = create_session(url, gpu_count=3)
    assert too_many.status == 400 and too_many.body["error"]["kind"] == "parse"
    assert too_many.body["error"]["message"] == "gpu_count 3 exceeds this server's GPU count (2)"
    for bad in (0, -1, 1.5, "2", True):
        refused = create_session(url, gpu_count=bad)
        assert refused.status == 400, bad
        assert refused.body["error"]["message"] == "gpu_count must be an integer from 1 to 2"
    assert get(url, "/v1/info").body["sessions"]["active"] == 0
    assert create_session(url, gpu_count=2).status == 201  # nothing was held by the refusals


def test_sessions_spread_over_the_gpus_with_the_fewest_sessions(server_factory) -> None:
    server = server_factory(
        "--device",
        "fake-gpu",
        "--fake-gpu-count",
        "3",
        "--workers-per-gpu",
        "1",
        "--max-sessions",
        "2",
    )
    url = server.url
    first = create_session(url, gpu_count=2).body
    second = create_session(url, gpu_count=2).body
    assert (first["gpu_ids"], second["gpu_ids"]) == ([0, 1], [0, 2])
    assert request(url, "DELETE", f"/v1/sessions/{first['session_id']}").status == 200
    third = create_session(url).body  # the default count, 1: GPU 1 is pinned to no live session
    assert third["gpu_count"] == 1 and third["gpu_ids"] == [1]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (bwrap)")
@pytest.mark.parametrize(
    "kcoral_server", [[*TWO_FAKE_GPUS, "--sandbox", "bubblewrap"]], indirect=True
)
def test_a_two_gpu_session_inside_the_bubblewrap_sandbox_sees_its_set(kcoral_server) -> None:
    url = kcoral_server.url
    created = create_session(url, gpu_count=2)
    if created.status == 503 and "start" in created.body["error"]["message"]:
        pytest.skip(f"bubblewrap cannot start a worker here: {created.body['error']['message']}")
    sid = created.body["session_id"]
    pid, visible = value_of(run_in(url, sid, module_program(STATE, [("put", ["k", 5])])), "put")
    assert visible == "0,1"
    assert value_of(run_in(url, sid, module_program(STATE, [("take", ["k"])])), "take") == [pid, 5]
    assert request(url, "DELETE", f"/v1/sessions/{sid}").status == 200
