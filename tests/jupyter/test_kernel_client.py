"""``client = %kcoral client``: the kernel's server and its token, looked up on every request.

The embedded server is real (a ``kcoral server`` child of this process, as a kernel starts
it), with the fresh token of each start."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kcoral_jupyter.extension import kernel_state_of
from kcoral_shell import kcoral_shell

import kcoral
from kcoral import Client, KCoralError, Program

pytestmark = pytest.mark.timeout(300)

FAST_LOCAL = ["--device", "cpu", "--sandbox", "none", "--log-dir", "", "--disk-cache-dir", ""]


@pytest.fixture
def embedded_shell(tmp_path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A shell with no server configured: the first use starts the embedded one."""
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    with kcoral_shell("", monkeypatch, ("client", "url")) as ip:
        kernel_state_of(ip).settings.local_args = FAST_LOCAL
        yield ip


def _seven() -> Program:
    program = Program()
    module = program.upload(kind="module", source="def seven():\n    return 7\n")
    seven = program.get_function(module=module, name="seven")
    program.return_(key="seven", value=program.run(fn=seven, args=[]))
    return program


def _returns_seven(client: Client) -> Any:
    return client.execute(_seven())["seven"]


def test_the_kernel_client_reaches_the_embedded_server_that_a_plain_client_cannot(
    embedded_shell,
) -> None:
    client = embedded_shell.run_line_magic("kcoral", "client")
    url = embedded_shell.run_line_magic("kcoral", "url")
    # Without the kernel's token the embedded server refuses (what the quickstart met).
    with pytest.raises(KCoralError) as refused:
        Client(url, token="").execute(_seven())
    assert refused.value.status_code == 401
    assert client.health()["status"] == "ok"
    assert _returns_seven(client) == 7
    assert isinstance(client, kcoral.Client)


def test_the_kernel_client_follows_a_restarted_embedded_server_and_its_new_token(
    embedded_shell,
) -> None:
    client = embedded_shell.run_line_magic("kcoral", "client")
    kernel = kernel_state_of(embedded_shell)
    assert _returns_seven(client) == 7
    first_url, first_token = kernel.local.url, kernel.local.token
    embedded_shell.run_line_magic("kcoral", "local stop")
    embedded_shell.run_line_magic("kcoral", "local start")
    assert kernel.local.token != first_token  # a fresh token at each start
    assert _returns_seven(client) == 7  # the same object, the new server and token
    assert client.base_url == kernel.local.url
    assert kernel.local.url != first_url or kernel.local.token != first_token
    # A job's event stream goes to the current server too, with its token.
    job = client.submit(_seven())
    assert [event.kind for event in job.events()][-1:] and job.result()["seven"] == 7


def test_the_kernel_client_never_shows_or_keeps_the_token(embedded_shell) -> None:
    client = embedded_shell.run_line_magic("kcoral", "client")
    client.health()
    token = kernel_state_of(embedded_shell).local.token
    assert token
    assert token not in repr(client) and token not in str(client)
    assert all(token not in value for value in client.headers.values())
    assert "Authorization" not in client.headers
    assert token not in repr(vars(client))
