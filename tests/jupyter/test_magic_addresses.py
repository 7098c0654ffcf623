"""The magics read server addresses by the rule ``Client`` and ``kcoral run`` share
(``kcoral.connection.server_address``, CLIENT_API §2): ``host:port`` works everywhere, and what the
rule refuses is a two-line error, never a request to a made-up URL."""

from __future__ import annotations

from typing import Any

import pytest
from IPython.utils.capture import capture_output
from kcoral_jupyter.cell_errors import ServerAddressError

pytestmark = pytest.mark.timeout(300)


def run(ip: Any, source: str) -> tuple[Any, Any]:
    with capture_output() as captured:
        result = ip.run_cell(source)
    return result, captured


def test_connect_and_url_take_host_and_port(shell, cpu_server_url) -> None:
    address = cpu_server_url.removeprefix("http://")
    result, captured = run(shell, f"%kcoral connect {address}")
    assert result.error_in_exec is None, result.error_in_exec
    assert f"connected to {cpu_server_url}" in captured.stdout
    result, _ = run(shell, f"%%kcoral --url {address}\n6 * 7\n")
    assert result.error_in_exec is None and result.result == 42


@pytest.mark.parametrize("address", ["localhost", "::1:8000", "ftp://h:21"])
def test_an_address_the_rule_refuses_is_two_lines_in_the_magics(shell, address) -> None:
    for source in (f"%kcoral connect {address}", f"%%kcoral --url {address}\n1\n"):
        result, _ = run(shell, source)
        error = result.error_in_exec
        assert isinstance(error, ServerAddressError), (source, error)
        lines = error._render_traceback_()
        assert len(lines) == 2 and lines[0].startswith("ServerAddressError: not a server address")
        assert "host:port" in lines[1]
