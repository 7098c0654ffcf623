"""Cache negotiation (PROTOCOL §9) and request ids (§8) seen from the client and the log."""

from __future__ import annotations

import uuid

import pytest
from e2e_support import (
    execute_body,
    execute_raw,
    finished_events,
    is_canonical_uuid,
    request,
    sha256,
)

import kcoral

READ = "def read(path):\n    with open(path, 'rb') as f:\n        return f.read()\n"


def blob_program(*payloads: bytes, file_payload: bytes | None = None) -> kcoral.Program:
    program = kcoral.Program()
    module = program.upload(kind="module", source=READ, id="m")
    read = program.get_function(module=module, name="read", id="read")
    for index, payload in enumerate(payloads):
        program.return_(key=f"b{index}", value=program.upload(kind="bytes", value=payload))
    if file_payload is not None:
        path = program.upload_file(blob=file_payload, path="inputs/data.bin", id="path")
        program.return_(key="file", value=program.run(fn=read, args=[path], id="content"))
    return program


def new_events(server, seen: int) -> list[dict]:
    return finished_events(server)[seen:]


def test_a_cold_program_misses_once_then_runs_and_a_repeat_is_a_warm_hit(client, e2e_server):
    tag = uuid.uuid4().bytes
    program = blob_program(b"one" + tag, b"two" + tag, file_payload=b"file" + tag)
    seen = len(finished_events(e2e_server))
    result = client.execute(program)
    assert result.completed, result.error
    assert result.results == {"b0": b"one" + tag, "b1": b"two" + tag, "file": b"file" + tag}
    first = new_events(e2e_server, seen)
    assert [e["finish_reason"] for e in first] == ["cache_miss", "completed"]
    assert first[0]["missing"] == 3 and first[0]["http_status"] == 200
    assert first[1]["request_id"] == result.request_id
    assert first[0]["request_id"] != result.request_id  # each attempt has its own id
    assert all(is_canonical_uuid(e["request_id"]) for e in first)

    seen = len(finished_events(e2e_server))
    again = client.execute(program)
    assert again.results == result.results
    assert [e["finish_reason"] for e in new_events(e2e_server, seen)] == ["completed"]

    # One new blob among known ones: only it is missing.
    seen = len(finished_events(e2e_server))
    third = client.execute(blob_program(b"one" + tag, b"three" + tag, file_payload=b"file" + tag))
    assert third.completed
    events = new_events(e2e_server, seen)
    assert (events[0]["finish_reason"], events[0].get("missing")) == ("cache_miss", 1)


def test_a_tensor_and_a_bytes_upload_of_the_same_content_share_one_blob(client, e2e_server):
    payload = uuid.uuid4().bytes  # 16 bytes = 4 float32 values
    program = kcoral.Program()
    program.return_(key="b", value=program.upload(kind="bytes", value=payload))
    program.return_(
        key="t", value=program.upload(kind="tensor", value=payload, dtype="float32", shape=[4])
    )
    seen = len(finished_events(e2e_server))
    result = client.execute(program)
    assert result["b"] == payload and result["t"].tobytes() == payload
    assert new_events(e2e_server, seen)[0]["missing"] == 1


def test_objects_over_a_quarter_of_the_memory_budget_miss_on_every_request(server_factory):
    server = server_factory("--cache-capacity-bytes", "4000")
    program = blob_program(bytes(2000) + uuid.uuid4().bytes)
    with kcoral.Client(server.url) as c:
        for _ in range(2):
            assert c.execute(program).completed
    assert [e["finish_reason"] for e in finished_events(server)] == [
        "cache_miss",
        "completed",
        "cache_miss",
        "completed",
    ]


@pytest.mark.slow
def test_file_blobs_survive_a_server_restart_in_the_disk_cache(server_factory, tmp_path):
    disk = tmp_path / "shared-disk-cache"
    payload = b"persistent " + uuid.uuid4().bytes
    program = blob_program(file_payload=payload)
    first = server_factory("--disk-cache-dir", str(disk), name="before")
    with kcoral.Client(first.url) as c:
        assert c.execute(program)["file"] == payload
    assert [e["finish_reason"] for e in finished_events(first)] == ["cache_miss", "completed"]
    assert first.stop() == 0
    stored = disk / "v1" / sha256(payload)[:2] / sha256(payload)
    assert stored.read_bytes() == payload

    second = server_factory("--disk-cache-dir", str(disk), name="after")
    with kcoral.Client(second.url) as c:
        assert c.execute(program)["file"] == payload
    assert [e["finish_reason"] for e in finished_events(second)] == ["completed"]


def test_a_client_supplied_canonical_request_id_is_echoed(e2e_server):
    request_id = str(uuid.uuid4())
    with kcoral.Client(e2e_server.url, headers={"X-Request-ID": request_id}) as c:
        result = c.execute(blob_program())
    assert result.request_id == request_id
    assert [e["finish_reason"] for e in finished_events(e2e_server, request_id)] == ["completed"]


@pytest.mark.parametrize(
    "supplied",
    [
        "6F1A2B3C-4D5E-4F60-8172-839405162738",  # upper case
        "6f1a2b3c4d5e4f608172839405162738",  # no hyphens
        "{6f1a2b3c-4d5e-4f60-8172-839405162738}",
        "not-a-uuid",
    ],
)
def test_a_non_canonical_request_id_is_replaced_by_a_fresh_one(e2e_server, supplied):
    with kcoral.Client(e2e_server.url, headers={"X-Request-ID": supplied}) as c:
        result = c.execute(blob_program())
    assert result.request_id != supplied and is_canonical_uuid(result.request_id)
    assert uuid.UUID(result.request_id).version == 4


def test_two_request_id_headers_are_both_ignored(e2e_server):
    one, two = str(uuid.uuid4()), str(uuid.uuid4())
    content_type, body = execute_body({"instructions": blob_program().instructions})
    response = request(
        e2e_server.url,
        "POST",
        "/execute",
        body,
        [("Content-Type", content_type), ("X-Request-ID", one), ("X-Request-ID", two)],
    )
    assert response.status == 200
    assert response.body["request_id"] not in (one, two)
    assert response.header_values("X-Request-ID") == [response.body["request_id"]]


def test_a_supplied_id_is_also_echoed_on_cache_misses_and_errors(e2e_server):
    request_id = str(uuid.uuid4())
    program = blob_program(uuid.uuid4().bytes)
    miss = execute_raw(
        e2e_server.url, {"instructions": program.instructions}, headers={"X-Request-ID": request_id}
    )
    assert miss.body["status"] == "CACHE_MISS" and miss.body["request_id"] == request_id
    bad = execute_raw(e2e_server.url, b"{", headers={"X-Request-ID": request_id})
    assert bad.status == 400 and bad.body["request_id"] == request_id
    assert bad.header_values("X-Request-ID") == [request_id]
