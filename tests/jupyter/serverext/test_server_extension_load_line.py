"""The line the Jupyter server logs as the KCoral server extension loads: it counts the
servers the panel will ask, wherever they are configured. It said "(0 servers)" of a Jupyter
server started with ``KCORAL_URL``, whose server the panel then listed."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from kcoral_jupyter.server_extension import load_server_extension
from traitlets.config import Config

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def jp_server_config() -> Config:
    return Config({"ServerApp": {"jpserver_extensions": {"kcoral_jupyter": True}}})


def load_lines(serverapp: Any) -> list[str]:
    """The load lines of the real Jupyter server's log as the extension loads (again)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    serverapp.log.addHandler(handler)
    try:
        load_server_extension(serverapp)
    finally:
        serverapp.log.removeHandler(handler)
    said = [record.getMessage() for record in records]
    return [line for line in said if line.startswith("KCoral server extension loaded")]


def test_the_load_line_counts_the_server_kcoral_url_names(
    monkeypatch: pytest.MonkeyPatch, jp_serverapp: Any
) -> None:
    monkeypatch.setenv("KCORAL_URL", "http://127.0.0.1:8123")
    assert load_lines(jp_serverapp) == [
        "KCoral server extension loaded (1 server: KCORAL_URL http://127.0.0.1:8123)"
    ]


def test_the_load_line_says_when_no_server_is_configured(
    monkeypatch: pytest.MonkeyPatch, jp_serverapp: Any
) -> None:
    monkeypatch.delenv("KCORAL_URL", raising=False)
    assert load_lines(jp_serverapp) == [
        "KCoral server extension loaded (no server configured: the servers kernels use are "
        "listed as they start)"
    ]


def test_the_load_line_never_writes_a_token_pasted_into_kcoral_url(
    monkeypatch: pytest.MonkeyPatch, jp_serverapp: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A neighbour who reads the Jupyter server's log (a shared log file, a job's output)
    read the token of a KCORAL_URL given as http://TOKEN@host."""
    monkeypatch.setenv("KCORAL_URL", "http://SECRET-TOKEN@127.0.0.1:8123/?token=SECRET-TOKEN")
    assert load_lines(jp_serverapp) == [
        "KCoral server extension loaded (no server: KCORAL_URL is not a server address (see "
        "the warning above))"
    ]
    assert "SECRET-TOKEN" not in caplog.text
    assert "KCORAL_URL is not used" in caplog.text


def test_a_configured_server_that_is_no_address_is_warned_of_as_the_extension_loads(
    jp_serverapp: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The load line counts what the panel lists, read once: a configured entry the address
    rule refuses was warned of only when the panel first asked, after a line counting it."""
    jp_serverapp.config.KCoralExtension.servers = [
        {"name": "gpu", "url": "http://127.0.0.1:8123"},
        {"name": "typo", "url": "htp:/nowhere"},
    ]
    with caplog.at_level(logging.WARNING):
        assert load_lines(jp_serverapp) == [
            "KCoral server extension loaded (2 servers: c.KCoralExtension.servers)"
        ]
    assert "c.KCoralExtension.servers[1] ('typo') is not used" in caplog.text
