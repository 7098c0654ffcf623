"""A large body's blob hashes are checked in executor tasks of about a MiB, not one task per
blob: an ``upload_folder`` of 20,000 small files was 20,000 hand-offs to the executor and
back, each a wake-up of the event loop (``benchmarks/send_files.py``: 1.5 s against 12 ms).
Large blobs still get a task each, so they hash in parallel; and a wrong hash among many
small blobs is still refused, naming its part."""

from __future__ import annotations

import hashlib

from http_helpers import execute, sha256
from kcoral_server.front_door.offload import HASH_TASK_BYTES, hash_tasks


def _blobs(count: int, size: int) -> dict[str, bytes]:
    datas = [index.to_bytes(8, "big") * (size // 8) for index in range(count)]
    return {hashlib.sha256(data).hexdigest(): data for data in datas}


def test_many_small_blobs_share_one_hashing_task_and_large_ones_get_one_each() -> None:
    small = _blobs(20000, 40)
    assert [len(task) for task in hash_tasks(small)] == [20000]
    large = _blobs(4, HASH_TASK_BYTES)
    assert [list(task) for task in hash_tasks(large)] == [[digest] for digest in large]
    mixed = {**_blobs(3, HASH_TASK_BYTES // 2), **_blobs(2, 16)}
    tasks = hash_tasks(mixed)
    assert [len(task) for task in tasks] == [2, 3]  # the second half-MiB closes a task
    assert [digest for task in tasks for digest in task] == list(mixed)  # each exactly once


def _listing_program(blobs: dict[str, bytes]) -> dict:
    instructions: list[dict] = [
        {"op": "upload", "id": f"u{index}", "kind": "file", "blob": digest, "path": f"in/{index}"}
        for index, digest in enumerate(blobs)
    ]
    source = "import os\ndef count():\n    return len(os.listdir('in'))\n"
    instructions += [
        {"op": "upload", "id": "m", "kind": "module", "source": source},
        {"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": "count"},
        {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": []},
        {"op": "return", "key": "count", "value": {"$ref": "r"}},
    ]
    return {"instructions": instructions}


def test_a_large_body_of_small_blobs_runs_and_one_wrong_hash_among_them_is_refused(
    kcoral_server,
) -> None:
    blobs = _blobs(3000, 32)  # a body far over the 64 KiB hashed on the event loop
    program = _listing_program(blobs)
    response = execute(kcoral_server.url, program, blobs)
    assert response.body["status"] == "COMPLETED", response.body
    assert response.body["results"]["count"]["value"] == 3000

    wrong = dict(_blobs(3000, 24))
    victim = list(wrong)[1700]
    wrong[victim] = b"not what the name says"
    refused = execute(kcoral_server.url, _listing_program(wrong), wrong)
    assert refused.status == 400 and refused.body["error"]["kind"] == "parse"
    message = refused.body["error"]["message"]
    assert f"blob:{victim}" in message and sha256(wrong[victim]) in message
