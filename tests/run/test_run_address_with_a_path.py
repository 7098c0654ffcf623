"""``kcoral run --url`` with a path pasted after a real server's address
(``http://127.0.0.1:PORT/v1``): every KCoral server answers ``/execute`` and job
submissions, so their 404 means the path is wrong. Before, the one line read only ``server
error: HTTP 404: not found``, which said nothing of what to change."""

from __future__ import annotations

import pytest

from kcoral.cli import main as kcoral_main

pytestmark = pytest.mark.timeout(120)


def test_a_404_under_a_pasted_path_says_to_give_the_servers_own_address(
    server_url: str, in_tmp, capsys: pytest.CaptureFixture[str]
) -> None:
    status = kcoral_main(["run", "shell", "--url", f"{server_url}/v1", "--", "true"])
    said = capsys.readouterr().err.strip().splitlines()
    assert status == 1, said
    assert said[-1] == (
        "kcoral run: server error: HTTP 404: not found; no KCoral server answers under the "
        f"path /v1: give the server's own address, {server_url} (a path only where a proxy "
        "serves it there)"
    ), said
    assert kcoral_main(["run", "shell", "--url", server_url, "--", "true"]) == 0


def test_a_host_port_with_a_pasted_path_says_to_drop_the_path_or_write_a_url(
    server_url: str, in_tmp, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: "'127.0.0.1:PORT/v1': the port must be a number from 1 to 65535", which it is.
    address = server_url.removeprefix("http://")
    status = kcoral_main(["run", "shell", "--url", f"{address}/v1", "--", "true"])
    said = capsys.readouterr().err.strip().splitlines()
    assert status == 2, said
    assert said[0] == (
        f"kcoral run: error: --url is not a valid server address: '{address}/v1': host:port "
        f"takes no path: give {address}, or a URL (http://{address}/v1) where a proxy serves "
        "KCoral under that path"
    ), said
    assert kcoral_main(["run", "shell", "--url", address, "--", "true"]) == 0
