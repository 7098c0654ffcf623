"""The X-KCoral-Serialization admission rule and its environment variable (EXTENSIONS §4),
through the server that applies them: real ``/execute`` requests against real servers
(``server_url`` allows both formats, ``json_only_server_url`` only json; an in-process
application for a list no variable can give), and the ``kcoral server`` command line.

What a request was admitted with is what its worker saw:
``kcoral_server.worker.trampoline.admitted_serialization``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import tornado.httpserver
import tornado.netutil
from kcoral_server.front_door.app import create_app
from kcoral_server.settings.command_line import parse_server_args
from kcoral_server.settings.config import ServerConfig
from raw_http import Response, call_program, execute_body, post_execute, request
from server_process import start_server

HEADER = "X-KCoral-Serialization"
ADMITTED_WITH = call_program(
    "from kcoral_server.worker.trampoline import admitted_serialization\n"
    "def main():\n"
    "    return admitted_serialization()\n"
)


def admitted(url: str, headers: list[tuple[str, str]]) -> Any:
    """The format the worker says the request was admitted with (None: none)."""
    content_type, body = execute_body(ADMITTED_WITH)
    answer = request(url, "POST", "/execute", body, [("Content-Type", content_type), *headers])
    assert answer.status == 200 and answer.body["status"] == "COMPLETED", answer.body
    node = answer.body["results"]["value"]
    return None if node == {"type": "null"} else node["value"]


def refused(url: str, headers: list[tuple[str, str]]) -> Response:
    content_type, body = execute_body(ADMITTED_WITH)
    return request(url, "POST", "/execute", body, [("Content-Type", content_type), *headers])


def message_from_an_app_allowing(allowed: list[str], header: str, tmp_path: Path) -> str:
    """The refusal of ``header`` by an in-process server whose configuration allows
    ``allowed`` (the check comes before the pool: it needs no workers)."""
    config = ServerConfig(
        device="cpu",
        sandbox="none",
        log_dir="",
        disk_cache_dir=tmp_path / "disk",
        allowed_serialization=allowed,
    )

    async def main() -> Response:
        app = create_app(config)
        sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
        server = tornado.httpserver.HTTPServer(app)
        server.add_sockets(sockets)
        url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, refused, url, [(HEADER, header)])
        finally:
            server.stop()
            app.state.executor.shutdown(wait=False)

    answer = asyncio.run(main())
    assert answer.status == 400 and answer.body["error"]["kind"] == "parse", answer.body
    return answer.body["error"]["message"]


def test_no_header_admits_the_request_without_a_format(json_only_server_url) -> None:
    assert admitted(json_only_server_url, []) is None


def test_an_allowed_format_is_admitted(server_url, json_only_server_url) -> None:
    assert admitted(server_url, [(HEADER, "pickle")]) == "pickle"
    assert admitted(json_only_server_url, [(HEADER, " json ")]) == "json"


def test_a_disallowed_format_gets_the_exact_message(json_only_server_url) -> None:
    answer = post_execute(json_only_server_url, ADMITTED_WITH, headers={HEADER: "pickle"})
    assert answer.status == 400 and answer.body["error"]["kind"] == "parse"
    message = answer.body["error"]["message"]
    assert message == "Serialization format 'pickle' not allowed. Allowed formats: ['json']"


def test_the_allowed_list_is_shown_in_configured_order(tmp_path) -> None:
    assert "Allowed formats: []" in message_from_an_app_allowing([], "json", tmp_path)
    assert "Allowed formats: ['pickle']" in message_from_an_app_allowing(
        ["pickle"], "json", tmp_path
    )


@pytest.mark.parametrize("values", [["yaml"], ["JSON"], [""], ["json, pickle"], ["json", "json"]])
def test_unknown_or_repeated_formats_are_rejected(server_url, values) -> None:
    answer = refused(server_url, [(HEADER, value) for value in values])
    assert answer.status == 400 and answer.body["error"]["kind"] == "parse"


def test_the_environment_default_allows_both_formats() -> None:
    assert parse_server_args([], {}).config.allowed_serialization == ["json", "pickle"]


def test_the_environment_list_keeps_order_and_drops_blanks_and_repeats() -> None:
    env = {"KCORAL_ALLOWED_SERIALIZATION": " pickle, ,json,pickle"}
    assert parse_server_args([], env).config.allowed_serialization == ["pickle", "json"]
    blank = {"KCORAL_ALLOWED_SERIALIZATION": " "}
    assert parse_server_args([], blank).config.allowed_serialization == ["json", "pickle"]


def test_an_unknown_name_in_the_environment_is_a_configuration_error(tmp_path) -> None:
    with pytest.raises(RuntimeError, match="yaml"):
        start_server(tmp_path, env={"KCORAL_ALLOWED_SERIALIZATION": "json,yaml"})
