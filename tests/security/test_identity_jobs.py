"""Attacks on jobs (issue 16, points 6 and 7d), against real servers.

* Another token holder (bob) lists, reads, streams, fetches and cancels alice's job: before
  the fix all of that worked and nothing said so. Now every such request answers exactly as
  an unknown job id does (404 ``not_found``), the job runs on, and only alice and the admin
  identity (root) reach it.
* Two small jobs returning a lot: before the fix their results stayed in the front-end's
  memory for the whole retention time. Now they lie in owner-only files, removed when the
  job is dropped and at shutdown.
"""

from __future__ import annotations

import http.client
import json
import os
import stat
import uuid
from pathlib import Path

from identity_support import TOKEN_A, TOKEN_B, TOKEN_R, Answer, module_program, request, token_file
from waiting import wait_for

import kcoral

WAIT_FOR_GO = """
import os, time
def f(go):
    print("alice's private output", flush=True)
    while not os.path.exists(go):
        time.sleep(0.02)
    return "alice's result"
"""

BIG = """
def f(n):
    return b"r" * n
"""


def _reaches(url: str, token: str, job_id: str) -> dict[str, Answer]:
    """Every way of reaching a job, as the raw requests an attacker would send."""
    return {
        "state": request(url, "GET", f"/v1/jobs/{job_id}", token),
        "events": request(url, "GET", f"/v1/jobs/{job_id}/events", token, stream=True),
        "result": request(url, "GET", f"/v1/jobs/{job_id}/result", token),
        "cancel": request(url, "DELETE", f"/v1/jobs/{job_id}", token),
    }


def _listed(url: str, token: str) -> list[str]:
    answer = request(url, "GET", "/v1/jobs", token)
    assert answer.status == 200
    return [job["job_id"] for job in answer.json]


def test_another_identity_cannot_list_read_stream_fetch_or_cancel_a_job(
    server_factory, tmp_path: Path
) -> None:
    server = server_factory(
        "--auth-token-file", str(token_file(tmp_path / "secrets")), "--num-workers", "2"
    )
    go = tmp_path / "go"
    with kcoral.Client(server.url, token=TOKEN_A) as alice:
        job = alice.submit(module_program(WAIT_FOR_GO, str(go)))
        unknown = _reaches(server.url, TOKEN_B, str(uuid.uuid4()))

        attacked = _reaches(server.url, TOKEN_B, job.id)
        assert job.id not in _listed(server.url, TOKEN_B)
        for way, answer in attacked.items():
            assert answer.status == 404, way
            assert answer.json["error"]["kind"] == "not_found", way
            # Not an existence oracle: the very answer an id that never existed gets.
            assert answer.error_without_request_id() == unknown[way].error_without_request_id()
            assert b"alice" not in answer.raw, way
        # bob's DELETE cancelled nothing: alice's job runs on and she reaches it.
        assert alice.job(job.id).status()["status"] in ("QUEUED", "RUNNING")
        assert job.id in _listed(server.url, TOKEN_A)
        # Each caller can learn who it is; the admin identity sees the job.
        assert request(server.url, "GET", "/v1/info", TOKEN_B).json["identity"] == "bob"
        assert job.id in _listed(server.url, TOKEN_R)
        by_admin = request(server.url, "GET", f"/v1/jobs/{job.id}", TOKEN_R)
        # and whose it is (team soak: the admin's list named nobody)
        assert by_admin.status == 200 and by_admin.json["owner"] == "alice"
        assert alice.job(job.id).status()["owner"] == "alice"

        go.touch()
        assert job.result().results["r"] == "alice's result"
        finished = _reaches(server.url, TOKEN_B, job.id)
        assert all(answer.status == 404 for answer in finished.values())
        assert job.id not in _listed(server.url, TOKEN_B)
        by_root = request(server.url, "GET", f"/v1/jobs/{job.id}/result", TOKEN_R)
        assert by_root.status == 200 and b"alice's result" in by_root.raw
        events = request(server.url, "GET", f"/v1/jobs/{job.id}/events", TOKEN_A)
        assert b"alice's private output" in events.raw

        # The admin identity may also cancel somebody else's job.
        second = alice.submit(module_program(WAIT_FOR_GO, str(tmp_path / "never")))
        cancelled = request(server.url, "DELETE", f"/v1/jobs/{second.id}", TOKEN_R)
        assert cancelled.status == 200 and cancelled.json["status"] == "CANCELLED"
        # and its owner reads who did (team soak: 'the job was cancelled', by nobody)
        told = request(server.url, "GET", f"/v1/jobs/{second.id}/result", TOKEN_A)
        assert told.status == 409 and told.json["error"]["message"] == (
            "the job was cancelled by admin root"
        )


def test_an_expired_job_of_another_identity_is_not_found_rather_than_expired(
    server_factory, tmp_path: Path
) -> None:
    """Only the owner (or the admin) learns that a job id existed and has expired."""
    tokens = str(token_file(tmp_path / "secrets"))
    server = server_factory("--auth-token-file", tokens, "--job-retention-seconds", "0.5")
    with kcoral.Client(server.url, token=TOKEN_A) as alice:
        job = alice.submit(module_program("def f():\n    return 1\n"))
        job.wait()
    path = f"/v1/jobs/{job.id}"
    wait_for(lambda: request(server.url, "GET", path, TOKEN_A).status == 404, "expiry", 60.0)
    assert request(server.url, "GET", path, TOKEN_A).json["error"]["kind"] == "job_expired"
    assert request(server.url, "GET", path, TOKEN_R).json["error"]["kind"] == "job_expired"
    by_bob = request(server.url, "GET", path, TOKEN_B)
    unknown = request(server.url, "GET", f"/v1/jobs/{uuid.uuid4()}", TOKEN_B)
    assert by_bob.error_without_request_id() == unknown.error_without_request_id()
    assert by_bob.json["error"]["kind"] == "not_found"


def test_holders_of_a_single_shared_token_share_their_jobs(server_factory) -> None:
    """Documented (README "Security"): one bare token is one identity, ``default``."""
    shared = "shared-token-0123456789"
    server = server_factory(env={"KCORAL_AUTH_TOKEN": shared})
    with kcoral.Client(server.url, token=shared) as first:
        job = first.submit(module_program("def f():\n    return 2\n"))
        job.wait()
    assert job.id in _listed(server.url, shared)
    assert request(server.url, "GET", f"/v1/jobs/{job.id}/result", shared).status == 200


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _spill_files(temp: Path) -> list[Path]:
    return sorted(p for d in temp.glob("kcoral-jobs-*") for p in d.iterdir())


RESULT_BYTES = 30 * 1024 * 1024


def test_large_job_results_leave_memory_for_private_files_removed_with_the_job(
    server_factory, tmp_path: Path
) -> None:
    temp = tmp_path / "temp"
    temp.mkdir()
    server = server_factory("--num-workers", "1", env={"TMPDIR": str(temp)})
    pid = server.process.pid
    with kcoral.Client(server.url) as client:
        warm = client.submit(module_program(BIG, 1024))  # the code paths, once, before measuring
        assert warm.result().results["r"] == b"r" * 1024
        before = _rss_bytes(pid)
        jobs = [client.submit(module_program(BIG, RESULT_BYTES)) for _ in range(2)]
        for job in jobs:
            job.wait()
        # Two finished results of 30 MiB each: kept in memory they added at least 60 MiB
        # for the whole retention time (polled: a reply's mappings may close a moment late).
        wait_for(lambda: _rss_bytes(pid) - before < RESULT_BYTES, "RSS back near its start", 20.0)

        files = _spill_files(temp)
        assert len(files) == 2
        directory = files[0].parent
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
        assert all(stat.S_IMODE(os.stat(f).st_mode) == 0o600 for f in files)
        assert all(os.stat(f).st_size >= RESULT_BYTES for f in files)
        # Read back from disk, whole and exact.
        assert jobs[0].result().results["r"] == b"r" * RESULT_BYTES
    server.stop()
    assert not directory.exists()  # removed at shutdown


def test_a_dropped_jobs_result_file_is_removed(server_factory, tmp_path: Path) -> None:
    temp = tmp_path / "temp"
    temp.mkdir()
    server = server_factory(
        "--num-workers", "1", "--job-retention-bytes", str(RESULT_BYTES + RESULT_BYTES // 2),
        env={"TMPDIR": str(temp)},
    )  # fmt: skip
    with kcoral.Client(server.url) as client:
        first = client.submit(module_program(BIG, RESULT_BYTES))
        first.wait()
        assert len(_spill_files(temp)) == 1
        second = client.submit(module_program(BIG, RESULT_BYTES))
        second.wait()
    # The bound dropped the older job, and its file with it.
    assert request(server.url, "GET", f"/v1/jobs/{first.id}").json["error"]["kind"] == (
        "job_expired"
    )
    assert len(_spill_files(temp)) == 1
    answer = request(server.url, "GET", f"/v1/jobs/{second.id}/result")
    assert answer.status == 200 and answer.raw.count(b"r" * 4096) >= RESULT_BYTES // 4096


LOUD = """
import sys
def f(lines):
    for i in range(lines):
        print(f"line {i:07d} " + "o" * 100)
    sys.stdout.flush()
    return lines
"""


def _event_ids_and_text(raw: bytes) -> tuple[list[int], str]:
    ids, text = [], ""
    for block in raw.decode().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "id" in fields:
            ids.append(int(fields["id"]))
            if fields.get("event") == "stdout":
                text += json.loads(fields["data"])["text"]
    return ids, text


def test_a_large_event_log_is_replayed_from_its_file_after_any_event_id(
    server_factory, tmp_path: Path
) -> None:
    temp = tmp_path / "temp"
    temp.mkdir()
    server = server_factory("--num-workers", "1", env={"TMPDIR": str(temp)})
    lines = 20_000  # about 2.3 MiB of output: more than a finished job keeps in memory
    with kcoral.Client(server.url) as client:
        job = client.submit(module_program(LOUD, lines), output_limit_bytes=4 << 20)
        job.wait()
    expected = "".join(f"line {i:07d} " + "o" * 100 + "\n" for i in range(lines))
    files = _spill_files(temp)
    assert files and any(os.stat(f).st_size > len(expected) for f in files)
    whole = request(server.url, "GET", f"/v1/jobs/{job.id}/events")
    ids, text = _event_ids_and_text(whole.raw)
    assert text == expected and ids == list(range(1, len(ids) + 1))
    middle = ids[len(ids) // 2]
    answer = http_get_after(server.url, f"/v1/jobs/{job.id}/events", middle)
    rest, _ = _event_ids_and_text(answer)
    assert rest == ids[middle:]


def http_get_after(url: str, path: str, last_event_id: int) -> bytes:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        connection.request("GET", path, headers={"Last-Event-ID": str(last_event_id)})
        return connection.getresponse().read()
    finally:
        connection.close()
