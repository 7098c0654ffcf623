"""A web page the user merely visits must not drive a KCoral server or router (issue 16.1).

Attacker: a *web page*. It can make the browser send a "simple" cross-site request (a
``multipart/form-data`` ``POST /execute`` needs no CORS preflight) to
``http://127.0.0.1:PORT``; with DNS rebinding it sends the request under its own name
(``Host: rebind.example``) and can read the answer. Each test sends exactly what a browser
would to a real ``kcoral server`` / ``kcoral router`` on loopback, and checks both the
``403 forbidden`` and that the program did not run (it would write a marker file).
"""

from __future__ import annotations

import http.client
import json
import socket
import sys
import time
from pathlib import Path

import pytest
from kcoral_server.router.settings import SettingsError, parse_router_args
from kcoral_server.settings.command_line import parse_server_args

import kcoral

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))
from router_helpers import Node, RouterProcess, ready_nodes, start_router

EVIL = "http://evil.example"
BOUNDARY = "----WebKitFormBoundaryK7cOrAl0000000"
WRITER = "def f(path):\n    open(path, 'w').write('ran')\n    return 1\n"
TOKEN = "s3cret-token-for-tests"


def marker_program(marker: Path) -> dict:
    """A program whose only effect is to create ``marker`` (the proof that it ran)."""
    return {
        "instructions": [
            {"op": "upload", "id": "m", "kind": "module", "source": WRITER},
            {"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": "f"},
            {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": [str(marker)]},
            {"op": "return", "key": "value", "value": {"$ref": "r"}},
        ]
    }


def form_body(program: dict) -> bytes:
    """The body ``fetch(url, {method: "POST", body: formData})`` sends: the program as a
    Blob part of type application/json (a "simple" request: no preflight)."""
    return (
        f"--{BOUNDARY}\r\n"
        'Content-Disposition: form-data; name="program"; filename="blob"\r\n'
        "Content-Type: application/json\r\n\r\n"
        f"{json.dumps(program)}\r\n"
        f"--{BOUNDARY}--\r\n"
    ).encode()


def send(
    url: str,
    method: str,
    path: str,
    *,
    host: str | None = None,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
    content_type: str = f"multipart/form-data; boundary={BOUNDARY}",
) -> tuple[int, dict]:
    """One request with exactly these headers (``host`` None: the URL's own authority)."""
    authority = url.split("://", 1)[1]
    address, port = authority.rsplit(":", 1)
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host or authority}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if body is not None:
        lines += [f"Content-Type: {content_type}"]
        lines += [f"Content-Length: {len(body)}"]
    data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
    with socket.create_connection((address.strip("[]"), int(port)), timeout=120) as sock:
        sock.sendall(data)
        response = http.client.HTTPResponse(sock)
        response.begin()
        raw = response.read()
    content_type = response.getheader("Content-Type") or ""
    document = json.loads(raw) if content_type.startswith("application/json") else {}
    return response.status, document


def browser_post(url: str, marker: Path, **kwargs) -> tuple[int, dict]:
    """The cross-site form post a page can make without any preflight."""
    return send(url, "POST", "/execute", body=form_body(marker_program(marker)), **kwargs)


def assert_forbidden(answer: tuple[int, dict], flag: str) -> None:
    status, document = answer
    assert status == 403, document
    assert document["error"]["kind"] == "forbidden", document
    assert flag in document["error"]["message"], document


# ------------------------------------------------------------------ kcoral server


def test_a_cross_site_form_post_is_refused_and_runs_nothing(kcoral_server, tmp_path: Path):
    marker = tmp_path / "ran"
    assert_forbidden(
        browser_post(kcoral_server.url, marker, headers={"Origin": EVIL}), "--allowed-origin"
    )
    assert not marker.exists(), "the page's program ran"
    # The same bytes without the browser's Origin are a valid request: the refusal above is
    # what stopped the program, not a malformed body.
    status, document = browser_post(kcoral_server.url, marker)
    assert status == 200 and marker.read_text() == "ran", document


def test_a_dns_rebinding_request_is_refused_on_every_endpoint(kcoral_server, tmp_path: Path):
    marker = tmp_path / "ran"
    rebound = f"rebind.example:{kcoral_server.port}"
    assert_forbidden(browser_post(kcoral_server.url, marker, host=rebound), "--allowed-host")
    assert not marker.exists(), "the rebound page's program ran"
    for path in ("/health", "/v1/info", "/v1/jobs", "/v1/jobs/anything", "/nowhere"):
        assert_forbidden(send(kcoral_server.url, "GET", path, host=rebound), "--allowed-host")


def test_an_origin_of_null_counts_as_a_web_page(kcoral_server, tmp_path: Path):
    marker = tmp_path / "ran"
    assert_forbidden(browser_post(kcoral_server.url, marker, headers={"Origin": "null"}), "Origin")
    assert not marker.exists()
    assert_forbidden(
        send(kcoral_server.url, "GET", "/health", headers={"Origin": EVIL}), "--allowed-origin"
    )


def test_a_fetch_from_a_page_of_another_port_is_refused_in_words_a_user_reads(kcoral_server):
    """A page on another port of the same host (same-site: JupyterLab's own neighbour) sends
    no ``Origin`` with a no-cors ``fetch()``; the refusal names it a fetch, where it read
    "a 'empty' request" (the raw ``Sec-Fetch-Dest``)."""
    fetch = {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "empty"}
    status, document = send(kcoral_server.url, "GET", "/v1/info", headers=fetch)
    assert status == 403, document
    assert document["error"]["message"] == (
        "requests from web pages are refused: a fetch request from a page of another origin "
        "(Sec-Fetch-Site 'same-site')"
    ), document
    script = {**fetch, "Sec-Fetch-Dest": "script"}
    status, document = send(kcoral_server.url, "GET", "/v1/jobs", headers=script)
    assert status == 403 and "refused: a script request from a page" in str(document), document


def test_the_refusal_is_logged_like_an_unauthorized_request(kcoral_server, tmp_path: Path):
    browser_post(kcoral_server.url, tmp_path / "ran", headers={"Origin": EVIL})

    def logged() -> bool:
        finished = [e for e in kcoral_server.events() if e["event"] == "request_finished"]
        return any(e["http_status"] == 403 and e["error_kind"] == "forbidden" for e in finished)

    deadline = time.monotonic() + 30  # the line is written just after the answer
    while not logged() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert logged()


def test_loopback_names_and_addresses_pass_with_their_port(kcoral_server):
    port = kcoral_server.port
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"127.0.0.2:{port}"):
        status, document = send(kcoral_server.url, "GET", "/v1/info", host=host)
        assert status == 200, (host, document)


def client_writes_marker(url: str, marker: Path) -> None:
    """KCoral's own client (it sends no Origin) runs the marker program at ``url``."""
    program = kcoral.Program()
    module = program.upload(kind="module", source=WRITER)
    function = program.get_function(module=module, name="f")
    program.return_(key="value", value=program.run(fn=function, args=[str(marker)]))
    with kcoral.Client(url) as client:
        assert client.health()["status"] == "ok"
        result = client.execute(program, timeout_seconds=60)
    assert result["value"] == 1 and marker.read_text() == "ran"


def test_the_kcoral_client_still_works(kcoral_server, tmp_path: Path):
    client_writes_marker(kcoral_server.url, tmp_path / "ran")


@pytest.mark.parametrize(
    "kcoral_server",
    [["--allowed-origin", "https://lab.example.org", "--allowed-host", "gpu.lan"]],
    indirect=True,
)
def test_an_allow_listed_origin_and_host_pass(kcoral_server, tmp_path: Path):
    marker = tmp_path / "ran"
    answer = browser_post(
        kcoral_server.url,
        marker,
        host=f"gpu.lan:{kcoral_server.port}",
        headers={"Origin": "https://lab.example.org"},
    )
    assert answer[0] == 200 and marker.exists(), answer
    assert_forbidden(
        browser_post(kcoral_server.url, marker, headers={"Origin": EVIL}), "--allowed-origin"
    )


def test_a_token_protected_server_checks_origin_before_the_token_and_skips_the_host_check(
    server_factory,
):
    server = server_factory(env={"KCORAL_AUTH_TOKEN": TOKEN})
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    # A rebound page cannot know the token, so the Host may be any name behind a proxy.
    status, document = send(server.url, "GET", "/v1/info", host="gpu.example", headers=bearer)
    assert status == 200, document
    assert send(server.url, "GET", "/v1/info", host="gpu.example")[0] == 401
    assert_forbidden(
        send(server.url, "GET", "/v1/info", headers={**bearer, "Origin": EVIL}), "--allowed-origin"
    )
    assert_forbidden(
        send(server.url, "GET", "/v1/info", headers={"Origin": EVIL}), "--allowed-origin"
    )


@pytest.mark.parametrize(
    "args",
    [["--allowed-origin", "*"], ["--allowed-origin", "null"], ["--allowed-host", "http://x/"]],
)
def test_allow_lists_that_would_let_any_page_in_are_refused_at_start(args, capsys):
    with pytest.raises(SystemExit) as stopped:
        parse_server_args(args, {})
    assert stopped.value.code == 2
    assert args[0] in capsys.readouterr().err
    with pytest.raises(SettingsError, match=args[0]):
        parse_router_args(args, {})


# ------------------------------------------------------------------ kcoral router


@pytest.fixture(scope="module")
def routed(tmp_path_factory: pytest.TempPathFactory):
    """A token-less router on loopback with one real node (supervisor + CPU server)."""
    tmp = tmp_path_factory.mktemp("browser-router")
    router = start_router(tmp, "--allowed-origin", "https://lab.example.org")
    node = Node(tmp, router, "n1")
    try:
        ready_nodes(router, 1)
        yield router, tmp
    finally:
        node.stop()
        router.stop()


def test_a_router_refuses_a_cross_site_form_post_and_its_node_runs_nothing(routed):
    router, tmp = routed
    marker = tmp / "ran-origin"
    assert_forbidden(browser_post(router.url, marker, headers={"Origin": EVIL}), "--allowed-origin")
    assert_forbidden(browser_post(router.url, marker, headers={"Origin": "null"}), "Origin")
    assert not marker.exists(), "the page's program ran on the node"
    for path in ("/health", "/v1/info", "/v1/jobs", "/nowhere"):
        answer = send(router.url, "GET", path, headers={"Origin": EVIL})
        assert_forbidden(answer, "--allowed-origin")


def test_a_router_refuses_a_dns_rebinding_request_on_every_endpoint(routed):
    router, tmp = routed
    marker = tmp / "ran-rebind"
    rebound = f"rebind.example:{router.port}"
    assert_forbidden(browser_post(router.url, marker, host=rebound), "--allowed-host")
    assert not marker.exists(), "the rebound page's program ran on the node"
    for path in ("/health", "/v1/info", "/v1/jobs", "/v1/jobs/x"):
        assert_forbidden(send(router.url, "GET", path, host=rebound), "--allowed-host")


def test_the_kcoral_client_still_works_through_a_router_and_its_node(routed):
    router, tmp = routed
    client_writes_marker(router.url, tmp / "ran-client")
    # A page-less request under a loopback name (no Origin) also reaches the node.
    marker = tmp / "ran-localhost"
    status, document = browser_post(router.url, marker, host=f"localhost:{router.port}")
    assert status == 200 and marker.exists(), document


def test_a_router_lets_an_allow_listed_origin_through(routed):
    router, _ = routed
    status, document = send(
        router.url, "GET", "/health", headers={"Origin": "https://lab.example.org"}
    )
    assert status == 200, document


def test_a_token_protected_router_checks_origin_before_the_token(tmp_path: Path):
    token_file = tmp_path / "tokens"
    token_file.write_text(TOKEN + "\n")
    router: RouterProcess = start_router(
        tmp_path, "--auth-token-file", str(token_file), "--allow-unauthenticated-nodes"
    )
    try:
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert_forbidden(
            send(router.url, "GET", "/v1/jobs", headers={**bearer, "Origin": EVIL}),
            "--allowed-origin",
        )
        # No node: 503, but the foreign Host is not what stops it (the token protects it).
        status, document = send(router.url, "GET", "/v1/jobs", host="gpu.example", headers=bearer)
        assert status != 403, document
        assert send(router.url, "GET", "/v1/jobs", host="gpu.example")[0] == 401
    finally:
        router.stop()
