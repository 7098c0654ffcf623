"""One /execute request end to end through the pipeline and its run: workspaces gone when
the answer arrives, a small body's blob reaching the worker and the cache, and the single
deadline alarm that times out a program between messages."""

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
