"""One /execute request end to end through the pipeline and its run: workspaces gone when
the answer arrives, a small body's blob reaching the worker and the cache, the single
deadline alarm that times out a program between messages, and the progress slot that names
a crashed instruction (and what a program can do to it)."""

from __future__ import annotations

import os

from http_helpers import execute, module_program, sha256

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


# A program that goes for the progress slot its worker shares with the front-end
# (progress_slot.ProgressSlot): through /proc/self/map_files it tries to shrink the memfd under the
# front-end's mapping (a SIGBUS there), then writes the slot and dies.
SLOT_ATTACK = """
import ctypes, os, struct
def _slot():
    for line in open("/proc/self/maps"):
        if "kcoral-progress" in line:
            return line.split()[0]
    return None
def shrink():
    where = _slot()
    if where is None:
        return "no slot mapped"
    try:
        fd = os.open(f"/proc/self/map_files/{where}", os.O_RDWR)
    except OSError as exc:
        return f"cannot open: {exc.errno}"
    try:
        os.ftruncate(fd, 0)
        return "shrunk"
    except OSError as exc:
        return f"refused: {exc.errno}"
    finally:
        os.close(fd)
def scribble_and_die(value):
    low = int(_slot().split("-")[0], 16)
    ctypes.memmove(low, struct.pack("<q", value), 8)
    os._exit(3)
"""


def test_a_program_cannot_shrink_the_progress_slot_under_the_front_end(kcoral_server) -> None:
    response = execute(kcoral_server.url, module_program(SLOT_ATTACK, [("shrink", [])]))
    assert response.body["status"] == "COMPLETED", response.body
    outcome = response.body["results"]["shrink#0"]["value"]
    assert outcome != "shrunk" and outcome != "no slot mapped"
    again = execute(kcoral_server.url, module_program(WORKSPACE_SOURCE, [("empty", [])]))
    assert again.body["status"] == "COMPLETED", again.body  # the front-end still answers


def test_without_a_live_observer_a_crash_is_attributed_by_the_progress_slot(
    kcoral_server,
) -> None:
    # A plain /execute gets no InstructionStarted frames: the slot alone names the crashed
    # instruction. Written by the program itself here (value 2 = instruction 1, the
    # get_function, not the run that dies), which shows it is the slot that is read; a
    # program could always misname its own crash (it can also forge frames).
    program = module_program(SLOT_ATTACK, [("scribble_and_die", [2])])
    response = execute(kcoral_server.url, program)
    body = response.body
    assert response.status == 200 and body["status"] == "FAILED", body
    assert body["error"]["message"] == (
        "worker exited while executing the instruction: it exited with status 3"
    )
    assert (body["error"]["instruction_index"], body["error"]["instruction_op"]) == (
        1,
        "get_function",
    )
    assert body["error"]["instruction_id"] == "f0"


def test_a_progress_value_written_by_a_program_that_names_no_instruction_is_ignored(
    kcoral_server,
) -> None:
    program = module_program(SLOT_ATTACK, [("scribble_and_die", [10**9])])
    response = execute(kcoral_server.url, program)
    assert response.status == 500, response.body
    assert response.body["error"]["message"] == "worker crashed: it exited with status 3"
    again = execute(kcoral_server.url, module_program(WORKSPACE_SOURCE, [("empty", [])]))
    assert again.body["status"] == "COMPLETED", again.body
