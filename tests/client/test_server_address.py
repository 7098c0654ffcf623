"""One rule for what a server address may look like (CLIENT_API §2):
``kcoral.connection.server_address``
decides for ``Client``, ``AsyncClient``, ``KCORAL_URL``, ``kcoral run --url``, the magics and
the Jupyter server extension. The rule's table, then each entry point against a real server
(the magics' in tests/jupyter/test_magic_messages.py, ``kcoral run``'s in
tests/run/test_run_e2e.py)."""

from __future__ import annotations

import asyncio

import pytest

from kcoral import AsyncClient, Client
from kcoral.connection.server_address import server_url


@pytest.mark.parametrize(
    ("address", "url"),
    [
        ("127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("localhost:8000", "http://localhost:8000"),  # not a URL of scheme "localhost"
        ("gpu-1.example:443/", "http://gpu-1.example:443"),
        ("[::1]:8000", "http://[::1]:8000"),
        ("  127.0.0.1:08000 ", "http://127.0.0.1:8000"),
        ("http://h:1/prefix/", "http://h:1/prefix"),
        ("HTTPS://k.example", "HTTPS://k.example"),
        ("http://[fe80::1]:8000", "http://[fe80::1]:8000"),
    ],
)
def test_an_address_the_rule_allows_names_one_url(address: str, url: str) -> None:
    assert server_url(address) == url


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("localhost", "port is required"),
        ("127.0.0.1", "port is required"),
        ("::1:8000", "IPv6 address goes in brackets"),
        ("http://::1:8000", "IPv6 address goes in brackets"),
        ("[::1]", "port is required"),
        ("[::g]:80", "not an IPv6 address"),
        ("h:0", "from 1 to 65535"),
        ("h:99999", "from 1 to 65535"),
        ("h:http", "from 1 to 65535"),
        ("ftp://h:21", "http:// or https://"),
        ("http://", "no host"),
        ("http://u:p@h:1", "credentials"),
        ("http://h:1/?q", "query or fragment"),
        ("a b:80", "whitespace"),
        ("", "empty"),
        ("h/p:80", "is not host:port"),
        ("127.0.0.1:8000/v1", r"host:port takes no path: give 127\.0\.0\.1:8000, or a URL"),
    ],
)
def test_an_address_the_rule_refuses_says_why(address: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        server_url(address)


def test_a_non_string_address_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        server_url(8000)


def test_client_and_async_client_take_host_and_port_as_the_magics_do(json_only_server_url) -> None:
    address = json_only_server_url.removeprefix("http://")
    with Client(address) as client:
        assert client.base_url == json_only_server_url
        assert client.health()["status"] == "ok"

    async def health() -> str:
        async with AsyncClient(address) as client:
            return (await client.health())["status"]

    assert asyncio.run(health()) == "ok"
    with pytest.raises(ValueError, match="base_url: 'localhost': the port is required"):
        Client("localhost")


def test_the_server_extension_lists_a_host_port_kcoral_url_as_its_url(monkeypatch) -> None:
    pytest.importorskip("jupyter_server", reason="the server extension needs jupyter_server")
    from kcoral_jupyter.server_extension import KCoralExtension

    monkeypatch.setenv("KCORAL_URL", "127.0.0.1:8123")
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", "/nonexistent-kcoral-runtime")
    found = KCoralExtension().resolved_servers()
    assert [entry["url"] for entry in found] == ["http://127.0.0.1:8123"]
    monkeypatch.setenv("KCORAL_URL", "localhost")  # refused by the rule: listed, never asked
    (refused,) = KCoralExtension().resolved_servers()
    assert refused["url"] == "localhost"
    assert refused["problem"].startswith("not a server address: 'localhost': the port is")
