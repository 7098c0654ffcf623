"""A request body over the limit the server's ``/v1/info`` states is refused before it is
sent (CLIENT_API §2.1 step 11); a body of exactly the limit is sent and runs, and whatever a
server states that is no positive integer limit blocks nothing."""

from __future__ import annotations

import json
import os

import pytest
from recording_transport import Recording, program_of
from server_answers import cache_miss, completed

from kcoral import Client, Program
from kcoral.connection.http import HttpTransport
from kcoral.connection.negotiation import Attempt, ExecuteNegotiation
from kcoral.connection.request_limit import ASK_FROM_BYTES, RequestTooLarge
from kcoral.errors import KCoralError

TOKEN = "a-token-made-as-the-readme-makes-one-0123456789"
BLOB_BYTES = ASK_FROM_BYTES + 4096


def body_length(program: Program) -> int:
    """The length of the attempt that carries the program's blobs."""
    negotiation = ExecuteNegotiation(program)
    negotiation.first_attempt()
    missing = json.dumps(cache_miss(*program.blobs)).encode()
    attempt = negotiation.handle_response(200, {}, "application/json", missing)
    assert isinstance(attempt, Attempt)
    return attempt.length


def test_a_body_over_the_stated_limit_is_refused_unsent_and_one_of_exactly_the_limit_runs(
    server_factory, tmp_path
):
    data = os.urandom(BLOB_BYTES + 1)
    limit = body_length(program_of(BLOB_BYTES, data))
    token_file = tmp_path / "client.token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    server = server_factory("--auth-token-file", str(token_file), "--max-request-bytes", str(limit))
    headers = {"Authorization": f"Bearer {TOKEN}"}
    transport = Recording(HttpTransport(server.url, headers=headers, connect_timeout_seconds=10))
    with Client(server.url, transport=transport) as client:
        result = client.execute(program_of(BLOB_BYTES, data))
        assert result.results["size"] == BLOB_BYTES
        assert ("POST", "/execute", limit) in transport.sent

        transport.sent.clear()
        with pytest.raises(RequestTooLarge) as refused:
            client.execute(program_of(BLOB_BYTES + 1, data))
    assert [request for request in transport.sent if request[2] > limit] == []
    assert (refused.value.status_code, refused.value.kind) == (413, "request_too_large")
    assert str(refused.value) == (
        f"request not sent: its body of 8.0 MiB ({limit + 1} bytes) is over the server's "
        f"limit of 8.0 MiB ({limit} bytes; kcoral server --max-request-bytes)"
    )


@pytest.mark.parametrize(
    "info",
    [
        pytest.param({"limits": {"max_request_bytes": "1"}}, id="a text"),
        pytest.param({"limits": {"max_request_bytes": True}}, id="a bool"),
        pytest.param({"limits": {"max_request_bytes": 1.5}}, id="a float"),
        pytest.param({"limits": {"max_request_bytes": 0}}, id="zero"),
        pytest.param({"limits": {"max_request_bytes": -5}}, id="negative"),
        pytest.param({"limits": {"max_request_bytes": 10**40}}, id="absurdly large"),
        pytest.param({"limits": [1]}, id="limits not an object"),
        pytest.param([1, 2], id="not an object"),
        pytest.param({"limits": {"max_request_bytes": 1}, "fleet": []}, id="a router's node's"),
        pytest.param(
            {"fleet": [], "fleet_limits": {"max_request_bytes": "1", "set_by": "nodes"}},
            id="a router's text",
        ),
        pytest.param(
            {"fleet": [], "fleet_limits": {"max_request_bytes": True}}, id="a router's bool"
        ),
        pytest.param({"fleet": [], "fleet_limits": {"max_request_bytes": 0}}, id="a router's 0"),
        pytest.param({"fleet": [], "fleet_limits": [1]}, id="a router's, not an object"),
        pytest.param(
            {"fleet": [], "fleet_limits": {"max_request_bytes": 10**40}},
            id="a router's absurdly large",
        ),
        pytest.param(None, id="no /v1/info"),
    ],
)
def test_a_limit_a_server_states_that_is_no_positive_integer_blocks_no_upload(canned_server, info):
    data = os.urandom(BLOB_BYTES)
    program = program_of(BLOB_BYTES, data)
    canned_server.add(cache_miss(*program.blobs))
    if info is None:  # a server of PROTOCOL.md alone
        canned_server.add({"error": {"kind": "not_found", "message": "no"}}, status=404)
    else:
        canned_server.add(info)
    canned_server.add(completed(results={"size": {"type": "integer", "value": BLOB_BYTES}}))
    with Client(canned_server.url) as client:
        result = client.execute(program)
    assert result.results["size"] == BLOB_BYTES
    assert [(r.method, r.path) for r in canned_server.requests] == [
        ("POST", "/execute"),
        ("GET", "/v1/info"),
        ("POST", "/execute"),
    ]
    assert len(canned_server.requests[-1].body) > BLOB_BYTES


def test_a_body_over_a_limit_stated_by_a_server_is_refused_whatever_the_servers_answers_after(
    canned_server,
):
    data = os.urandom(BLOB_BYTES)
    program = program_of(BLOB_BYTES, data)
    canned_server.add(cache_miss(*program.blobs))
    canned_server.add({"limits": {"max_request_bytes": ASK_FROM_BYTES}})
    with Client(canned_server.url) as client, pytest.raises(KCoralError) as refused:
        client.execute(program)
    assert isinstance(refused.value, RequestTooLarge)
    assert [(r.method, r.path) for r in canned_server.requests] == [
        ("POST", "/execute"),
        ("GET", "/v1/info"),
    ]


def test_a_client_asks_its_servers_limit_once_for_all_its_large_bodies(canned_server):
    # asked afresh for each body, the question cost a round trip per attempt
    data = os.urandom(BLOB_BYTES + 2)
    with Client(canned_server.url) as client:
        for extra in (0, 1, 2):
            program = program_of(BLOB_BYTES + extra, data)
            canned_server.add(cache_miss(*program.blobs))
            if extra == 0:
                canned_server.add({"limits": {"max_request_bytes": 4 * BLOB_BYTES}})
            canned_server.add(completed(results={"size": {"type": "integer", "value": 1}}))
            client.execute(program)
    assert [(r.method, r.path) for r in canned_server.requests] == [
        ("POST", "/execute"),
        ("GET", "/v1/info"),
        ("POST", "/execute"),
    ] + [("POST", "/execute")] * 4


@pytest.mark.parametrize(
    ("answer", "asked_again"),
    [
        pytest.param(None, True, id="a kept limit the body is over"),
        pytest.param(413, True, id="a 413 to a body under the kept limit"),
        pytest.param(200, False, id="a body under the kept limit that ran"),
    ],
)
def test_a_kept_limit_never_refuses_a_body_the_server_would_now_take(
    canned_server, answer, asked_again
):
    # a server restarted with another limit: one over the kept limit is asked again before
    # a body is refused, and a 413 (a smaller limit now) forgets the kept one
    data = os.urandom(BLOB_BYTES * 2)
    first, second = program_of(BLOB_BYTES, data), program_of(BLOB_BYTES + 4096, data)
    kept = BLOB_BYTES * 2 if answer else body_length(first)
    canned_server.add(cache_miss(*first.blobs))
    canned_server.add({"limits": {"max_request_bytes": kept}})
    if answer == 413:
        refusal = {"error": {"kind": "request_too_large", "message": "over the limit"}}
        canned_server.add(refusal, status=413)
    else:
        canned_server.add(completed(results={"size": {"type": "integer", "value": 1}}))
    canned_server.add(cache_miss(*second.blobs))
    if asked_again:
        canned_server.add({"limits": {"max_request_bytes": BLOB_BYTES * 4}})
    canned_server.add(completed(results={"size": {"type": "integer", "value": 2}}))
    with Client(canned_server.url) as client:
        if answer == 413:
            with pytest.raises(KCoralError) as refused:
                client.execute(first)
            assert refused.value.status_code == 413
        else:
            client.execute(first)
        assert client.execute(second).results["size"] == 2
    asked = [r.path for r in canned_server.requests].count("/v1/info")
    assert asked == (2 if asked_again else 1)


@pytest.mark.parametrize(
    ("set_by", "whose"),
    [
        ("router", "the router's limit of 8.0 MiB ({} bytes; kcoral router --max-request-bytes)"),
        (
            "nodes",
            "the largest limit of the router's ready nodes, 8.0 MiB ({} bytes; kcoral server "
            "--max-request-bytes on the nodes)",
        ),
    ],
)
def test_a_body_over_a_routers_fleet_limit_is_refused_unsent_naming_who_set_it(
    canned_server, set_by: str, whose: str
):
    data = os.urandom(BLOB_BYTES)
    program = program_of(BLOB_BYTES, data)
    canned_server.add(cache_miss(*program.blobs))
    fleet_limits = {"max_request_bytes": ASK_FROM_BYTES, "set_by": set_by}
    # its ``limits`` are one node's, larger: the fleet's hold
    canned_server.add(
        {"limits": {"max_request_bytes": 1 << 40}, "fleet": [], "fleet_limits": fleet_limits}
    )
    with Client(canned_server.url) as client, pytest.raises(RequestTooLarge) as refused:
        client.execute(program)
    assert str(refused.value).endswith("is over " + whose.format(ASK_FROM_BYTES)), refused.value
    assert [(r.method, r.path) for r in canned_server.requests] == [
        ("POST", "/execute"),
        ("GET", "/v1/info"),
    ]
