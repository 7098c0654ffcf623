"""The lean request path: small bodies in memory, workspaces made and removed on the loop,
one deadline alarm per program, and a seat handed out without a task."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from http_helpers import execute, module_program, sha256
from kcoral_server.body import SMALL_BODY_BYTES, RequestBody, memfd_locations
from kcoral_server.workspace import NO_OUTPUT, Workspace

# ------------------------------------------------------------------ request body


def test_a_small_declared_body_is_received_into_memory_without_a_memfd() -> None:
    body = RequestBody(1 << 20, 11)
    body.write(b"hello ")
    body.write(memoryview(b"world"))
    view = body.finish()
    assert body.fd is None
    assert bytes(view) == b"hello world" and view.readonly
    # a blob inside it is copied into a memfd for the worker
    located, fds, copies = memfd_locations({"a": view[6:]})
    assert (located, fds) == ([], [])
    assert [(sha, bytes(data)) for sha, data in copies] == [("a", b"world")]
    body.close()


def test_a_small_body_that_outgrows_its_declaration_continues_in_a_memfd() -> None:
    body = RequestBody(1 << 20, 10)
    body.write(b"x" * 10)
    body.write(b"y" * SMALL_BODY_BYTES)
    assert body.fd is not None and body.size == 10 + SMALL_BODY_BYTES
    view = body.finish()
    assert bytes(view[:12]) == b"x" * 10 + b"yy" and len(view) == body.size
    fd = body.fd
    body.close()
    with pytest.raises(OSError):
        os.fstat(fd)


def test_an_unknown_or_large_length_still_goes_to_a_memfd() -> None:
    for expected in (None, SMALL_BODY_BYTES + 1):
        body = RequestBody(1 << 30, expected)
        assert body.fd is not None
        body.write(b"abc")
        assert bytes(body.finish()) == b"abc"
        body.close()


# ------------------------------------------------------------------ workspace


def test_a_workspace_is_private_and_its_capture_files_are_made_in_a_missing_directory(
    tmp_path: Path,
) -> None:
    output = tmp_path / "not" / "yet"
    workspace = Workspace.create(output, "123")
    try:
        assert workspace.path.name.startswith("kcoral-program-")
        assert stat.S_IMODE(os.stat(workspace.root).st_mode) == 0o700
        assert workspace.stdout_path == output / "123.out"
        assert workspace.stderr_path == output / "123.err"
        for path in (workspace.stdout_path, workspace.stderr_path):
            assert path.read_bytes() == b""
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
    finally:
        workspace.remove()
    assert not workspace.path.exists()


def test_an_empty_workspace_is_removed_at_once_and_a_used_one_is_left_for_the_walk(
    tmp_path: Path,
) -> None:
    empty = Workspace.create(tmp_path, None)
    assert empty.remove_if_empty() and not empty.path.exists()
    assert empty.remove_if_empty()  # already gone counts as removed
    used = Workspace.create(tmp_path, None)
    (used.path / "sub").mkdir()
    (used.path / "sub" / "file").write_bytes(b"data")
    assert not used.remove_if_empty() and used.path.exists()
    used.remove()
    assert not used.path.exists()


def test_small_output_is_read_directly_and_large_output_is_left_to_the_executor(
    tmp_path: Path,
) -> None:
    workspace = Workspace.create(tmp_path, "7")
    try:
        workspace.stdout_path.write_bytes(b"0123456789")
        workspace.stderr_path.write_bytes("é".encode())
        small = workspace.read_small_output(4, 64)
        assert small == workspace.read_output(4)
        assert (small.stdout, small.stdout_truncated) == ("0123", True)
        assert (small.stderr, small.stderr_truncated) == ("é", False)
        assert workspace.read_small_output(4, 11) is None
        workspace.stderr_path.unlink()  # a missing capture file reads as empty
        assert workspace.read_small_output(100, 64).stderr == ""
        assert workspace.read_small_output(0, 64) is NO_OUTPUT
    finally:
        workspace.remove()


# ------------------------------------------------------------------ end to end

WORKSPACE_SOURCE = """
import os
def empty():
    return os.getcwd()
def used():
    os.makedirs("a/b")
    with open("a/b/file", "w") as f:
        f.write("x")
    return os.getcwd()
"""


def test_empty_and_used_workspaces_are_gone_when_the_answer_arrives(kcoral_server) -> None:
    program = module_program(WORKSPACE_SOURCE, [("empty", []), ("used", [])])
    response = execute(kcoral_server.url, program)
    assert response.body["status"] == "COMPLETED", response.body
    results = response.body["results"]
    empty, used = results["empty#0"]["value"], results["used#1"]["value"]
    assert empty == used and os.path.basename(empty).startswith("kcoral-program-")
    assert not os.path.exists(empty)
    second = execute(kcoral_server.url, module_program(WORKSPACE_SOURCE, [("empty", [])]))
    assert second.body["status"] == "COMPLETED", second.body
    again = second.body["results"]["empty#0"]["value"]
    assert again != empty and not os.path.exists(again)  # a new one per request


def test_a_small_body_with_a_blob_reaches_the_worker_and_the_cache(kcoral_server) -> None:
    data = os.urandom(2000)
    program = {
        "instructions": [
            {"op": "upload", "id": "b", "kind": "bytes", "blob": sha256(data)},
            {"op": "return", "key": "b", "value": {"$ref": "b"}},
        ]
    }
    first = execute(kcoral_server.url, program, {sha256(data): data})
    second = execute(kcoral_server.url, program)  # from the memory cache
    for response in (first, second):
        assert response.body["status"] == "COMPLETED", response.body
        node = response.body["results"]["b"]
        assert response.parts[node["part"]] == data
    wrong = execute(kcoral_server.url, program, {sha256(data): data[:-1] + b"?"})
    assert wrong.status == 400 and wrong.body["error"]["kind"] == "parse"


def test_a_program_that_outlives_its_deadline_between_messages_times_out(kcoral_server) -> None:
    source = "import time\ndef nap(s):\n    time.sleep(s)\n    return s\n"
    program = module_program(source, [("nap", [0.05]), ("nap", [0.05]), ("nap", [30])])
    program["options"] = {"timeout_seconds": 1.5}
    response = execute(kcoral_server.url, program)
    assert response.status == 504 and response.body["error"]["kind"] == "timeout"
    again = execute(kcoral_server.url, module_program(source, [("nap", [0])]))
    assert again.body["status"] == "COMPLETED", again.body
