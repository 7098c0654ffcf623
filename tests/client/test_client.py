"""Client against a canned Tornado server: negotiation, errors, transport, interrupts."""

from __future__ import annotations

import asyncio
import hashlib
import json
import signal
import socket
import threading
import warnings

import numpy as np
import pytest
from server_answers import REQUEST_ID, cache_miss, completed

import kcoral
from kcoral import AsyncClient, Client, Program
from kcoral.errors import KCoralError, ProtocolError, TransportError
from kcoral.protocol.multipart import encode_multipart


def two_blob_program():
    program = Program()
    program.upload(kind="bytes", value=b"first")
    program.upload(kind="bytes", value=b"second")
    return program, list(program.blobs)


def multipart_body(result, *binaries):
    parts = [("result", "application/json", json.dumps(result).encode())]
    parts += [(f"return:{i}", "application/octet-stream", data) for i, data in enumerate(binaries)]
    content_type, chunks, _ = encode_multipart(parts)
    return content_type, b"".join(bytes(chunk) for chunk in chunks)


def test_a_completed_json_answer_becomes_a_program_result(canned_server):
    canned_server.add(completed(results={"answer": {"type": "integer", "value": 42}}))
    with Client(canned_server.url + "//") as client:
        result = client.execute(Program(), timeout_seconds=30)
    assert result.completed and result["answer"] == 42
    assert result.elapsed_ms == 12.0 and isinstance(result.elapsed_ms, float)
    request = canned_server.requests[0]
    assert request.path == "/execute"
    (name, content_type, data), *rest = request.parts()
    assert (name, content_type, rest) == ("program", "application/json", [])
    assert data == b'{"instructions":[],"options":{"timeout_seconds":30}}'


def test_options_are_sent_only_when_given_and_non_ascii_is_kept(canned_server):
    canned_server.add(completed())
    program = Program()
    program.upload(kind="module", source="s = 'é'")
    Client(canned_server.url).execute(program)
    data = canned_server.requests[0].parts()[0][2]
    assert b'"options"' not in data and "é".encode() in data


def test_a_multipart_answer_decodes_tensors_bytes_and_files(canned_server):
    tensor = np.arange(4, dtype="<f4")
    raw = tensor.tobytes()
    result = completed(
        results={
            "y": {
                "type": "tensor",
                "dtype": "float32",
                "shape": [2, 2],
                "part": "return:0",
                "sha256": hashlib.sha256(raw).hexdigest(),
            },
            "b": {"type": "bytes", "part": "return:1", "sha256": hashlib.sha256(b"x").hexdigest()},
        }
    )
    content_type, body = multipart_body(result, raw, b"x")
    canned_server.add(body, content_type=content_type)
    out = Client(canned_server.url).execute(Program())
    assert out["y"].tolist() == [[0.0, 1.0], [2.0, 3.0]]
    assert out["y"].flags.writeable and out["y"].flags.owndata
    assert out["b"] == b"x"


def test_cache_misses_send_the_missing_blobs_then_all_blobs_with_node_echo(canned_server):
    program, (first, second) = two_blob_program()
    canned_server.add(cache_miss(second), headers={"X-KCoral-Node": "node-a"})
    canned_server.add(cache_miss(first), headers={"X-KCoral-Node": "node-b"})
    canned_server.add(completed())
    result = Client(canned_server.url).execute(program)
    assert result.completed
    attempts = canned_server.requests
    assert [len(r.parts()) for r in attempts] == [1, 2, 3]
    assert attempts[1].parts()[1] == (f"blob:{second}", "application/octet-stream", b"second")
    assert [p[0] for p in attempts[2].parts()] == ["program", f"blob:{first}", f"blob:{second}"]
    assert len({r.parts()[0][2] for r in attempts}) == 1  # identical program bytes
    assert [r.header("X-KCoral-Node") for r in attempts] == [None, "node-a", "node-b"]


def test_a_node_header_longer_than_512_characters_is_not_echoed(canned_server):
    program, (first, _) = two_blob_program()
    canned_server.add(cache_miss(first), headers={"X-KCoral-Node": "n" * 513})
    canned_server.add(completed())
    Client(canned_server.url).execute(program)
    assert canned_server.requests[1].header("X-KCoral-Node") is None


def test_a_third_cache_miss_is_a_protocol_error(canned_server):
    program, (first, _) = two_blob_program()
    for _ in range(3):
        canned_server.add(cache_miss(first))
    with pytest.raises(ProtocolError):
        Client(canned_server.url).execute(program)
    assert len(canned_server.requests) == 3


def test_a_cache_miss_naming_a_foreign_hash_is_a_protocol_error(canned_server):
    program, _ = two_blob_program()
    canned_server.add(cache_miss("ab" * 32))
    with pytest.raises(ProtocolError, match="not a blob of this program"):
        Client(canned_server.url).execute(program)
    assert len(canned_server.requests) == 1


def test_an_error_body_becomes_a_kcoral_error_with_its_fields(canned_server):
    body = {"status": "ERROR", "request_id": REQUEST_ID, "error": {"kind": "busy", "message": "m"}}
    canned_server.add(body, status=503, headers={"Retry-After": "1"})
    with pytest.raises(KCoralError) as caught:
        Client(canned_server.url).execute(Program())
    error = caught.value
    assert (error.status_code, error.kind, error.message, error.request_id) == (
        503,
        "busy",
        "m",
        REQUEST_ID,
    )
    assert str(error) == "HTTP 503: m"
    assert len(canned_server.requests) == 1  # no retry on 503


def test_an_unparseable_error_body_falls_back_to_the_status_and_header_id(canned_server):
    canned_server.add(
        b"<html>bad gateway</html>",
        status=502,
        content_type="text/html",
        headers={"X-Request-ID": "rid"},
    )
    with pytest.raises(KCoralError) as caught:
        Client(canned_server.url).execute(Program())
    assert caught.value.message == "HTTP 502" and caught.value.request_id == "rid"
    assert caught.value.kind is None


def test_an_error_body_without_a_message_says_server_error(canned_server):
    canned_server.add({"status": "ERROR", "request_id": "r", "error": {"kind": "engine"}}, 500)
    with pytest.raises(KCoralError, match="HTTP 500: server error"):
        Client(canned_server.url).health()


def test_a_closed_port_is_a_transport_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(TransportError):
        Client(f"http://127.0.0.1:{port}", connect_timeout_seconds=2).health()


def test_health_and_target_validate_the_body(canned_server):
    health = {"status": "ok", "target": {"arch": "sm_90a"}}
    canned_server.add(health)
    canned_server.add(health)
    canned_server.add({"status": "ok", "target": {}})
    canned_server.add({"status": "starting"})
    canned_server.add(b"[1]")
    client = Client(canned_server.url)
    assert client.health() == health
    assert client.target() == {"arch": "sm_90a"}
    for _ in range(3):
        with pytest.raises(ProtocolError):
            client.target()


def test_the_client_works_inside_a_running_event_loop(canned_server):
    canned_server.add({"status": "ok", "target": {}})

    async def inside_loop():
        return Client(canned_server.url).health()

    assert asyncio.run(inside_loop())["status"] == "ok"


def test_connections_are_kept_alive_between_requests(canned_server):
    canned_server.add({"status": "ok"})
    canned_server.add({"status": "ok"})
    client = Client(canned_server.url)
    client.health()
    client.health()
    first, second = canned_server.requests
    assert first.connection == second.connection


def test_token_and_headers_are_sent_but_never_shown(canned_server, monkeypatch):
    monkeypatch.setenv("KCORAL_TOKEN", "from-env")
    canned_server.add({"status": "ok"})
    canned_server.add({"status": "ok"})
    client = Client(canned_server.url, headers={"X-Request-ID": "abc"}, token="s3cret")
    client.health()
    Client(canned_server.url).health()
    explicit, from_env = canned_server.requests
    assert explicit.header("Authorization") == "Bearer s3cret"
    assert explicit.header("X-Request-ID") == "abc"
    assert from_env.header("Authorization") == "Bearer from-env"
    assert "s3cret" not in repr(client) and "s3cret" not in str(client)


def test_info_is_read_once_and_warns_once_on_a_version_mismatch(canned_server):
    canned_server.add({"kcoral": "99.1.0", "protocol": 1, "features": []})
    client = Client(canned_server.url)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert client.info()["kcoral"] == "99.1.0"
        client.info()
    assert len(canned_server.requests) == 1
    assert [w.category for w in caught] == [UserWarning]


def test_info_with_the_same_minor_version_does_not_warn(canned_server):
    major, minor = kcoral.__version__.split(".")[:2]
    canned_server.add({"kcoral": f"{major}.{minor}.77", "protocol": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Client(canned_server.url).info()


def test_execute_argument_errors_happen_before_any_request(canned_server):
    client = Client(canned_server.url)
    with pytest.raises(TypeError):
        client.execute({"instructions": []})  # type: ignore[arg-type]
    for bad in (0, 9, True, 2.0):
        with pytest.raises(ValueError):
            client.execute(Program(), gpu_count=bad)
    with pytest.raises(ValueError):
        client.execute(Program(), timeout_seconds=float("nan"))
    assert canned_server.requests == []


def test_a_keyboard_interrupt_closes_the_connection_and_propagates(canned_server):
    canned_server.add(hang=True)
    canned_server.add({"status": "ok"})
    client = Client(canned_server.url)
    main = threading.get_ident()

    def interrupt():
        if canned_server.hung.wait(10):
            signal.pthread_kill(main, signal.SIGINT)

    helper = threading.Thread(target=interrupt)
    helper.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            client.execute(Program())
    finally:
        helper.join()
    assert canned_server.closed.wait(10)  # the server saw the client go away
    client.health()  # a fresh connection, not the interrupted one
    hung, fresh = canned_server.requests
    assert hung.connection != fresh.connection


def test_cancelling_the_task_of_an_async_execute_closes_its_connection(canned_server):
    # AsyncClient's twin of Ctrl-C (asyncio.wait_for's timeout, a task group's failure):
    # before, the request ran on in its transport thread to the server's answer, so the
    # server never saw the client go away and ran the program to its end.
    canned_server.add(hang=True)
    canned_server.add({"status": "ok"})

    async def scenario() -> None:
        async with AsyncClient(canned_server.url) as client:
            running = asyncio.ensure_future(client.execute(Program()))
            while not canned_server.hung.is_set():
                await asyncio.sleep(0.01)
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await running
            assert await asyncio.to_thread(canned_server.closed.wait, 10)
            await client.health()  # a fresh connection, not the cut one

    asyncio.run(scenario())
    hung, fresh = canned_server.requests
    assert hung.connection != fresh.connection


def test_an_async_request_cancelled_while_it_waits_for_a_connection_is_never_sent(
    canned_server,
):
    canned_server.add(hang=True)
    canned_server.add({"status": "ok"})

    async def scenario() -> None:
        async with AsyncClient(canned_server.url, max_connections=1) as client:
            first = asyncio.ensure_future(client.execute(Program()))
            while not canned_server.hung.is_set():
                await asyncio.sleep(0.01)
            queued = asyncio.ensure_future(client.health())  # behind the first, in line
            await asyncio.sleep(0.2)
            queued.cancel()
            first.cancel()
            for task in (queued, first):
                with pytest.raises(asyncio.CancelledError):
                    await task
            assert await asyncio.to_thread(canned_server.closed.wait, 10)
            await client.health()

    asyncio.run(scenario())
    assert [r.path for r in canned_server.requests] == ["/execute", "/health"]
