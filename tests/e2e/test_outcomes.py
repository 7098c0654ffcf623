"""Every outcome of PROTOCOL §7.1 through the real client, with the exact bodies checked raw."""

from __future__ import annotations

import re
import threading

import pytest
from e2e_support import (
    CACHE_MISS_FIELDS,
    ERROR_FIELDS,
    ERROR_OBJECT_FIELDS,
    FAILED_FIELDS,
    RESULT_FIELDS,
    execute_program,
    execute_raw,
    finished_events,
    health,
    is_canonical_uuid,
    module_program,
    request,
    sha256,
)
from waiting import wait_for

import kcoral

SLEEPER = "import time\ndef sleep(s):\n    time.sleep(s)\n    return s\n"


def assert_error_answer(response, status: int, kind: str, message: str | None = None) -> None:
    assert response.status == status
    assert response.headers.get("Content-Type", "").startswith("application/json")
    assert set(response.body) == ERROR_FIELDS
    assert response.body["status"] == "ERROR"
    assert set(response.body["error"]) == {"kind", "message"}
    assert response.body["error"]["kind"] == kind
    assert isinstance(response.body["error"]["message"], str)
    if message is not None:
        assert response.body["error"]["message"] == message
    assert response.header_values("X-Request-ID") == [response.body["request_id"]]
    assert is_canonical_uuid(response.body["request_id"])


def test_a_completed_program_decodes_and_its_json_body_has_exactly_the_protocol_fields(
    client, e2e_server
):
    program = module_program("def add(a, b):\n    return a + b\n", "add", [40, 2])
    result = client.execute(program)
    assert result.status == "COMPLETED" and result.completed
    assert result["out"] == 42 and result.error is None
    assert is_canonical_uuid(result.request_id)
    assert result.lease_wait_ms == 0 and result.lease_held_ms == 0  # CPU server
    assert result.elapsed_ms >= 0 and result.queue_ms >= 0

    raw = execute_program(e2e_server.url, program)
    assert raw.status == 200
    assert raw.headers.get("Content-Type", "").split(";")[0] == "application/json"
    assert set(raw.body) == RESULT_FIELDS
    assert raw.body["results"] == {"out": {"type": "integer", "value": 42}}
    assert raw.header_values("X-Request-ID") == [raw.body["request_id"]]
    assert raw.body["stdout_truncated"] is False and raw.body["stderr_truncated"] is False


def test_a_completed_program_with_a_binary_result_is_multipart_with_result_first(e2e_server):
    program = module_program("def b():\n    return [b'xy', {'k': b'z'}]\n", "b")
    raw = execute_program(e2e_server.url, program)
    assert raw.status == 200
    assert raw.headers["Content-Type"].startswith("multipart/form-data")
    assert raw.part_order == ["result", "return:0", "return:1"]
    assert set(raw.body) == RESULT_FIELDS
    node = raw.body["results"]["out"]
    assert node == {
        "type": "array",
        "value": [
            {"type": "bytes", "part": "return:0", "sha256": sha256(b"xy")},
            {
                "type": "object",
                "value": {"k": {"type": "bytes", "part": "return:1", "sha256": sha256(b"z")}},
            },
        ],
    }
    assert raw.parts == {"return:0": b"xy", "return:1": b"z"}


def test_a_failed_program_keeps_earlier_returns_and_reports_the_exact_error_object(
    client, e2e_server
):
    program = kcoral.Program()
    module = program.upload(kind="module", source="def div(a, b):\n    return a / b\n", id="m")
    div = program.get_function(module=module, name="div", id="div")
    answer = program.run(fn=div, args=[84, 2], id="answer")
    program.return_(key="answer", value=answer)
    program.run(fn=div, args=[1, 0], id="bad")
    program.return_(key="never", value=answer)
    result = client.execute(program)
    assert result.status == "FAILED" and not result.completed
    assert result.results == {"answer": 42.0}
    assert set(result.error) == ERROR_OBJECT_FIELDS
    assert result.error["kind"] == "runtime"
    assert result.error["message"] == "ZeroDivisionError: division by zero"
    assert result.error["instruction_index"] == 4
    assert result.error["instruction_op"] == "run"
    assert result.error["instruction_id"] == "bad"
    assert "<uploaded:" in result.error["traceback"]

    raw = execute_program(e2e_server.url, program)
    assert raw.status == 200 and set(raw.body) == FAILED_FIELDS
    assert set(raw.body["error"]) == ERROR_OBJECT_FIELDS


@pytest.mark.parametrize(
    ("source", "kind", "message"),
    [
        ("def f():\n    assert 1 == 2, 'nope'\n", "correctness", "AssertionError: nope"),
        ("def f():\n    raise KeyError('k')\n", "runtime", "KeyError: 'k'"),
        (
            "from kcoral.errors import ExecutionError\n"
            "def f():\n    raise ExecutionError('correctness', 'custom words')\n",
            "correctness",
            "custom words",
        ),
        ("def f():\n    raise SystemExit(3)\n", "runtime", "SystemExit: 3"),
        ("f = 5\n", "runtime", "handle 'f' is not callable"),
        ("def f():\n    return object()\n", "serialization", None),
        ("def f():\n    return float('nan')\n", "serialization", None),
        ("def f():\n    return {1: 2}\n", "serialization", None),
    ],
)
def test_instruction_failures_reach_the_client_with_their_protocol_kind(
    client, source, kind, message
):
    result = client.execute(module_program(source, "f"))
    assert result.status == "FAILED"
    assert result.error["kind"] == kind
    if message is not None:
        assert result.error["message"] == message
    if kind == "serialization":
        assert result.error["instruction_op"] == "return"
        assert result.error["instruction_id"] is None
        assert result.results == {}


def test_module_load_failures_are_parse_or_runtime_and_a_missing_name_is_parse(client):
    syntax = client.execute(module_program("def f(:\n", "f"))
    assert (syntax.error["kind"], syntax.error["instruction_index"]) == ("parse", 0)
    assert syntax.error["instruction_op"] == "upload" and syntax.error["instruction_id"] == "m"
    top_level = client.execute(module_program("raise ValueError('at load')\n", "f"))
    assert top_level.error["kind"] == "runtime"
    assert top_level.error["message"] == "ValueError: at load"
    missing = client.execute(module_program("def g():\n    pass\n", "f"))
    assert (missing.error["kind"], missing.error["instruction_op"]) == ("parse", "get_function")


def test_get_function_on_a_bytes_handle_is_an_instruction_failure(client):
    program = kcoral.Program()
    data = program.upload(kind="bytes", value=b"abc")
    program.get_function(module=data, name="f")
    result = client.execute(program)
    assert result.status == "FAILED"
    assert result.error["instruction_op"] == "get_function"
    assert result.error["kind"] in {"runtime", "unavailable"}


def test_a_cache_miss_body_has_exactly_status_request_id_and_ordered_missing_blobs(e2e_server):
    program = kcoral.Program()
    first = program.upload(kind="bytes", value=b"cache-miss-body-one")
    program.upload(kind="bytes", value=b"cache-miss-body-two")
    program.return_(key="v", value=first)
    document = {"instructions": program.instructions}
    raw = execute_raw(e2e_server.url, document)
    assert raw.status == 200
    assert raw.headers["Content-Type"].split(";")[0] == "application/json"
    assert set(raw.body) == CACHE_MISS_FIELDS and raw.body["status"] == "CACHE_MISS"
    assert raw.body["missing_blobs"] == [
        sha256(b"cache-miss-body-one"),
        sha256(b"cache-miss-body-two"),
    ]
    assert raw.header_values("X-Request-ID") == [raw.body["request_id"]]


def test_a_malformed_body_is_a_400_parse_error_body(e2e_server):
    response = request(
        e2e_server.url,
        "POST",
        "/execute",
        b"--b\r\nContent-Type: application/json\r\n\r\n{}\r\n",
        {"Content-Type": "multipart/form-data; boundary=b"},
    )
    assert_error_answer(response, 400, "parse")


def test_a_400_from_the_client_carries_kind_message_and_request_id(client):
    with pytest.raises(kcoral.KCoralError) as caught:
        client.execute(module_program("def f():\n    pass\n", "f"), timeout_seconds=-1)
    error = caught.value
    assert (error.status_code, error.kind) == (400, "parse")
    assert is_canonical_uuid(error.request_id)
    assert str(error) == f"HTTP 400: {error.message}"


@pytest.mark.slow
def test_a_request_over_max_request_bytes_is_413_after_the_cache_miss(server_factory):
    server = server_factory("--max-request-bytes", "65536")
    program = kcoral.Program()
    data = program.upload(kind="bytes", value=bytes(100_000))
    program.return_(key="v", value=data)
    with kcoral.Client(server.url) as c, pytest.raises(kcoral.KCoralError) as caught:
        c.execute(program)
    assert caught.value.status_code == 413
    assert caught.value.kind == "request_too_large"
    # PROTOCOL §7.1's text first, then the sizes and the flag (EXTENSIONS §10)
    said = re.compile(
        r"request exceeds the configured size limit: (\d+) bytes, limit 65536 bytes "
        r"\(max_request_bytes; kcoral server --max-request-bytes\)"
    )
    shown = said.fullmatch(caught.value.message)
    assert shown is not None and int(shown.group(1)) > 100_000, caught.value.message
    raw = execute_program(server.url, program)
    assert_error_answer(raw, 413, "request_too_large")
    assert said.fullmatch(raw.body["error"]["message"])
    reasons = [e["finish_reason"] for e in finished_events(server) if e["http_status"] == 413]
    assert reasons and set(reasons) == {"rejected"}


@pytest.mark.slow
def test_results_over_max_response_bytes_are_500_response_too_large_and_the_worker_stays(
    server_factory,
):
    server = server_factory("--max-response-bytes", "200000")
    # a string: its JSON passes the limit (binary parts are bounded one return at a time)
    program = module_program("def big():\n    return 'x' * 300000\n", "big")
    with kcoral.Client(server.url) as c:
        with pytest.raises(kcoral.KCoralError) as caught:
            c.execute(program)
        assert caught.value.status_code == 500
        assert caught.value.kind == "response_too_large"
        # Issue 20.4: PROTOCOL's fixed text, then the sizes and the flag (EXTENSIONS §10);
        # this assertion used to expect the fixed text alone.
        message = caught.value.message
        assert message.startswith("results exceed the configured response-size limit: ")
        assert "limit 200000 bytes" in message and "--max-response-bytes" in message
        raw = execute_program(server.url, program)
        assert_error_answer(raw, 500, "response_too_large")
        assert raw.body["error"]["message"].startswith(message.partition(":")[0] + ": ")
        # A file return over the budget is an instruction failure instead (§5.4).
        files = kcoral.Program()
        files.upload_file(blob=b"y" * 300000, path="big.bin")
        files.return_file(key="f", path="big.bin")
        failed = c.execute(files)
        assert failed.status == "FAILED" and failed.error["kind"] == "serialization"
        # with the sizes and the flag too (it named max_response_bytes alone)
        assert failed.error["message"] == (
            "return of 'big.bin' would exceed the response size limit: 300000 bytes, "
            "200000 bytes left (max_response_bytes; kcoral server --max-response-bytes)"
        )
        # A value's binary parts are bounded the same way, before they are made (a broadcast
        # view of 4 bytes as 4 GiB killed the worker at its memory limit); it was a 500.
        source = "import numpy as np\ndef big(n):\n    return np.broadcast_to(np.int32(1), (n,))\n"
        values = kcoral.Program()
        values.return_(key="first", value=values.upload(kind="bytes", value=b"kept"))
        big = values.get_function(module=values.upload(kind="module", source=source), name="big")
        values.return_(key="big", value=values.run(fn=big, args=[2**30]))
        failed = c.execute(values)
        assert failed.status == "FAILED" and failed.error["kind"] == "serialization"
        assert failed.error["message"] == (
            "return would exceed the response size limit: a tensor of 4294967296 bytes, "
            "199996 bytes left (max_response_bytes; kcoral server --max-response-bytes)"
        )
        assert failed.results == {"first": b"kept"}
        small = c.execute(module_program("def f():\n    return 1\n", "f"))
        assert small["out"] == 1
    assert any(
        e["finish_reason"] == "server_error" and e.get("error_kind") == "response_too_large"
        for e in finished_events(server)
    )


@pytest.mark.slow
def test_a_request_that_waits_too_long_for_a_worker_is_503_busy_with_retry_after(
    server_factory,
):
    server = server_factory("--num-workers", "1", "--worker-wait-timeout-seconds", "1")
    holder: dict[str, object] = {}

    def occupy() -> None:
        with kcoral.Client(server.url) as c:
            holder["result"] = c.execute(module_program(SLEEPER, "sleep", [6]))

    thread = threading.Thread(target=occupy)
    thread.start()
    try:
        wait_for(lambda: health(server.url)["load"]["requests_in_progress"] == 1, "busy", 60.0)
        with kcoral.Client(server.url) as c, pytest.raises(kcoral.KCoralError) as caught:
            c.execute(module_program("def f():\n    return 1\n", "f"))
        assert (caught.value.status_code, caught.value.kind) == (503, "busy")
        waited = (
            "server saturated: no worker became free within --worker-wait-timeout-seconds (1 s)"
        )
        assert caught.value.message == waited
        raw = execute_program(server.url, module_program("def f():\n    return 1\n", "f"))
        assert_error_answer(raw, 503, "busy", waited)
        assert raw.header_values("Retry-After") == ["1"]
    finally:
        thread.join(60)
    assert holder["result"].completed
    assert any(e["finish_reason"] == "no_worker" for e in finished_events(server))


@pytest.mark.slow
def test_an_execution_past_its_deadline_is_504_timeout_without_results(client, e2e_server):
    program = kcoral.Program()
    module = program.upload(kind="module", source=SLEEPER, id="m")
    sleep = program.get_function(module=module, name="sleep", id="sleep")
    quick = program.run(fn=sleep, args=[0], id="quick")
    program.return_(key="quick", value=quick)
    program.run(fn=sleep, args=[60], id="slow")
    with pytest.raises(kcoral.KCoralError) as caught:
        client.execute(program, timeout_seconds=1.5)
    assert (caught.value.status_code, caught.value.kind) == (504, "timeout")
    # SERVER §8: the message names the deadline and the setting that set it
    assert caught.value.message.startswith("execution timed out after its deadline of 1.5 s")
    raw = execute_program(e2e_server.url, program, {"timeout_seconds": 1.5})
    assert_error_answer(raw, 504, "timeout")
    assert raw.body["error"]["message"] == caught.value.message
    assert finished_events(e2e_server, raw.body["request_id"])[0]["finish_reason"] == "timeout"
    # The seat comes back: later programs run.
    assert client.execute(module_program("def f():\n    return 7\n", "f"))["out"] == 7


def test_a_worker_that_exits_non_zero_in_teardown_fails_the_program_with_the_exit_code(
    server_factory,
):
    server = server_factory("--max-requests-per-worker", "1")
    source = "import atexit, os\natexit.register(os._exit, 3)\ndef f():\n    return 1\n"
    with kcoral.Client(server.url) as c:
        result = c.execute(module_program(source, "f"))
        assert result.status == "FAILED", result
        assert result.error["kind"] == "runtime"
        assert result.error["message"] == "worker exited with code 3 during teardown"
        assert result.results == {"out": 1}
        assert c.execute(module_program("def f():\n    return 2\n", "f"))["out"] == 2
