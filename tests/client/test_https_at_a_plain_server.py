"""An ``https://`` address at a KCoral server (plain HTTP, SERVER §2) says what to try. The
error was only the TLS library's words (``[SSL: WRONG_VERSION_NUMBER] wrong version number
(_ssl.c:1006)``, or ``EOF occurred in violation of protocol``), in the client, the notebook
and ``kcoral run`` alike (runner soak). A real server on loopback."""

from __future__ import annotations

import pytest

import kcoral
from kcoral.errors import PLAIN_HTTP_HINT, TransportError, root_reason


def test_an_https_address_at_a_plain_http_server_says_to_try_http(kcoral_server) -> None:
    address = kcoral_server.url.replace("http://", "https://", 1)
    with kcoral.Client(address) as client, pytest.raises(TransportError) as failed:
        client.health()
    assert str(failed.value).endswith(PLAIN_HTTP_HINT), failed.value
    # the one line the notebook and kcoral run say
    assert root_reason(failed.value).endswith(PLAIN_HTTP_HINT)
    with kcoral.Client(kcoral_server.url) as client:
        assert client.health()["status"] == "ok"  # the server never minded
