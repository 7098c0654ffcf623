"""`kcoral run --fetch` of an output larger than the server's answer can carry (CLIENT_API
§11): the tool ran and its exit status came back, so the run says which output did not fit
and exits as the tool did. It read "remote program failed (serialization): return of
'outputs/big.bin' would exceed the response size limit: ... (max_response_bytes; ...)",
exit status 1, whatever the tool's own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from run_as_a_user import ServerWithAToken, kcoral_run, server_with_a_token


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerWithAToken]:
    """A server whose answers carry at most 1 MiB."""
    directory = tmp_path_factory.mktemp("small-answers")
    with server_with_a_token(directory, ["--max-response-bytes", "1M"]) as started:
        yield started


def writes_two_mib_then_exits(status: int) -> str:
    return (
        "import os; os.makedirs('res', exist_ok=True); "
        "open('res/big.bin', 'wb').write(bytes(2 << 20)); "
        f"print('written'); raise SystemExit({status})"
    )


@pytest.mark.parametrize(("tool_status", "run_status"), [(0, 1), (3, 3)])
def test_an_output_over_the_servers_answer_is_named_and_the_run_exits_as_the_tool_did(
    server: ServerWithAToken, tmp_path: Path, tool_status: int, run_status: int
) -> None:
    code = writes_two_mib_then_exits(tool_status)
    argv = ["python", "--fetch", "res", "--out", "got", "--", "-c", code]
    done = kcoral_run(server, *argv, cwd=tmp_path)
    assert done.returncode == run_status, done.stderr
    assert done.stdout == "written\n"
    said = done.stderr.splitlines()
    assert len(said) == 1, done.stderr
    assert said[0].startswith(
        "kcoral run: the outputs were not fetched: res/big.bin is 2.0 MiB, more than the "
    )
    assert said[0].endswith(
        " MiB left in the server's answer (kcoral server --max-response-bytes); nothing was "
        f"saved to '{tmp_path / 'got'}'"
    )
    assert not (tmp_path / "got").exists()


def test_outputs_within_the_servers_answer_still_come_back(
    server: ServerWithAToken, tmp_path: Path
) -> None:
    code = "open('small.txt', 'w').write('small')"
    argv = ["python", "--fetch", "small.txt", "--out", "got", "--", "-c", code]
    done = kcoral_run(server, *argv, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "got" / "small.txt").read_text() == "small"
