"""Programs end to end through a real server and real workers."""

from __future__ import annotations

import threading
import time

import pytest
from http_helpers import execute, get, module_program, sha256
from server_process import start_server

BYTES = b"some bytes for the memory cache"
FILE = b"hello\n"


def cache_program() -> dict:
    return {
        "instructions": [
            {
                "op": "upload",
                "id": "p",
                "kind": "file",
                "path": "in/hello.txt",
                "blob": sha256(FILE),
            },
            {"op": "upload", "id": "b", "kind": "bytes", "blob": sha256(BYTES)},
            {"op": "return", "key": "b", "value": {"$ref": "b"}},
            {"op": "return", "key": "copy", "kind": "file", "path": "in/hello.txt"},
        ]
    }


def test_a_cache_miss_then_a_retry_with_blobs_then_a_warm_hit(kcoral_server) -> None:
    program = cache_program()
    first = execute(kcoral_server.url, program)
    assert first.status == 200
    assert first.body == {
        "status": "CACHE_MISS",
        "request_id": first.body["request_id"],
        "missing_blobs": [sha256(FILE), sha256(BYTES)],
    }
    blobs = {sha256(FILE): FILE, sha256(BYTES): BYTES}
    second = execute(kcoral_server.url, program, blobs)
    assert second.body["status"] == "COMPLETED", second.body
    third = execute(kcoral_server.url, program)
    assert third.body["status"] == "COMPLETED", third.body
    for response in (second, third):
        results = response.body["results"]
        assert response.parts[results["b"]["part"]] == BYTES
        assert response.parts[results["copy"]["part"]] == FILE
    finished = [e for e in kcoral_server.events() if e["event"] == "request_finished"]
    assert [e["finish_reason"] for e in finished] == ["cache_miss", "completed", "completed"]
    assert finished[0]["missing"] == 2


def test_file_blobs_survive_a_restart_in_the_disk_cache(tmp_path) -> None:
    disk = tmp_path / "shared-disk-cache"
    program = {
        "instructions": [
            {"op": "upload", "kind": "file", "path": "f.txt", "blob": sha256(FILE)},
            {"op": "return", "key": "f", "kind": "file", "path": "f.txt"},
        ]
    }
    first = start_server(tmp_path / "a", ["--disk-cache-dir", str(disk)])
    try:
        assert execute(first.url, program, {sha256(FILE): FILE}).body["status"] == "COMPLETED"
    finally:
        first.stop()
    second = start_server(tmp_path / "b", ["--disk-cache-dir", str(disk)])
    try:
        warm = execute(second.url, program)
    finally:
        second.stop()
    assert warm.body["status"] == "COMPLETED", warm.body


def test_a_blob_used_as_file_and_bytes_needs_both_caches(kcoral_server) -> None:
    data = b"shared"
    program = {
        "instructions": [
            {"op": "upload", "kind": "file", "path": "f", "blob": sha256(data)},
            {"op": "upload", "id": "b", "kind": "bytes", "blob": sha256(data)},
        ]
    }
    assert execute(kcoral_server.url, program).body["missing_blobs"] == [sha256(data)]
    assert execute(kcoral_server.url, program, {sha256(data): data}).body["status"] == "COMPLETED"
    assert execute(kcoral_server.url, program).body["status"] == "COMPLETED"


def test_a_tensor_with_the_wrong_length_is_a_400_even_when_other_blobs_are_missing(
    kcoral_server,
) -> None:
    data = b"\x00" * 12
    program = {
        "instructions": [
            {
                "op": "upload",
                "id": "t",
                "kind": "tensor",
                "dtype": "float32",
                "shape": [4],
                "blob": sha256(data),
            },
            {"op": "upload", "id": "b", "kind": "bytes", "blob": "0" * 64},
        ]
    }
    response = execute(kcoral_server.url, program, {sha256(data): data})
    assert response.status == 400 and response.body["error"]["kind"] == "parse"


def test_a_blob_with_a_wrong_hash_is_rejected(kcoral_server) -> None:
    program = {"instructions": [{"op": "upload", "id": "b", "kind": "bytes", "blob": sha256(b"a")}]}
    response = execute(kcoral_server.url, program, {sha256(b"a"): b"b"})
    assert response.status == 400 and response.body["error"]["kind"] == "parse"


OUTPUT_SOURCE = """
import os, sys
def shout(n):
    print("o" * n)
    sys.stderr.write("e" * n)
    os.write(1, b"!")
    return n
"""


def test_output_is_captured_per_stream_and_truncated_at_the_limit(kcoral_server) -> None:
    program = module_program(OUTPUT_SOURCE, [("shout", [100])], output_limit_bytes=10)
    body = execute(kcoral_server.url, program).body
    assert body["status"] == "COMPLETED"
    assert body["stdout"] == "o" * 10 and body["stdout_truncated"] is True
    assert body["stderr"] == "e" * 10 and body["stderr_truncated"] is True
    short = execute(kcoral_server.url, module_program(OUTPUT_SOURCE, [("shout", [3])])).body
    assert short["stdout"] == "ooo\n!" and short["stderr"] == "eee"
    assert short["stdout_truncated"] is short["stderr_truncated"] is False


def test_an_output_limit_of_zero_disables_capture(kcoral_server) -> None:
    program = module_program(OUTPUT_SOURCE, [("shout", [5])], output_limit_bytes=0)
    body = execute(kcoral_server.url, program).body
    assert (body["stdout"], body["stderr"]) == ("", "")
    assert body["stdout_truncated"] is body["stderr_truncated"] is False


def test_a_completed_body_has_exactly_the_documented_fields(kcoral_server) -> None:
    body = execute(kcoral_server.url, module_program(OUTPUT_SOURCE, [("shout", [1])])).body
    assert list(body) == [
        "status",
        "request_id",
        "queue_ms",
        "elapsed_ms",
        "lease_wait_ms",
        "lease_held_ms",
        "stdout",
        "stderr",
        "stdout_truncated",
        "stderr_truncated",
        "results",
    ]
    assert body["lease_wait_ms"] == body["lease_held_ms"] == 0


def test_a_failed_program_keeps_earlier_returns(kcoral_server) -> None:
    source = "def ok():\n    return 1\n\ndef bad():\n    raise ValueError('nope')\n"
    body = execute(kcoral_server.url, module_program(source, [("ok", []), ("bad", [])])).body
    assert body["status"] == "FAILED"
    assert list(body["results"]) == ["ok#0"]
    assert body["error"]["kind"] == "runtime" and body["error"]["instruction_index"] == 5


def test_the_event_log_records_a_request_in_order(kcoral_server) -> None:
    response = execute(kcoral_server.url, module_program(OUTPUT_SOURCE, [("shout", [1])]))
    rid = response.body["request_id"]
    events = [e for e in kcoral_server.events() if e.get("request_id") == rid]
    assert [e["event"] for e in events] == [
        "request_received",
        "request_accepted",
        "request_routed",
        "request_finished",
    ]
    finished = events[-1]
    assert finished["finish_reason"] == "completed" and finished["http_status"] == 200
    assert (kcoral_server.events()[0]["event"]) == "server_started"
    program_files = list(kcoral_server.log_dir.glob(f"runs/*/programs/{rid}.json"))
    assert len(program_files) == 1


GATED = """
import os, time
def gated(gate):
    while not os.path.exists(gate):
        time.sleep(0.02)
    return os.getpid()
"""


@pytest.mark.parametrize("kcoral_server", [["--num-workers", "2"]], indirect=True)
def test_eight_concurrent_clients_share_two_workers(kcoral_server, tmp_path) -> None:
    gate = tmp_path / "gate"
    program = module_program(GATED, [("gated", [str(gate)])])
    results: list = []
    threads = [
        threading.Thread(target=lambda: results.append(execute(kcoral_server.url, program)))
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    # Both workers busy, the other six queued: the server's own counters say so.
    deadline = time.monotonic() + 30
    load = {}
    while time.monotonic() < deadline:
        load = get(kcoral_server.url, "/health").body["load"]
        if load["requests_waiting"] == 6:
            break
        time.sleep(0.02)
    assert load == {"request_capacity": 2, "requests_in_progress": 2, "requests_waiting": 6}
    gate.touch()
    for thread in threads:
        thread.join()
    assert [r.body["status"] for r in results] == ["COMPLETED"] * 8
    assert len({r.body["results"]["gated#0"]["value"] for r in results}) == 2
    routed = [e for e in kcoral_server.events() if e["event"] == "request_routed"]
    assert {e["worker_id"] for e in routed} == {"cpu/w0", "cpu/w1"}
