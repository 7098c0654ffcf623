"""What a user reads when a remote call is interrupted or fails, against a real server with a
client token (CLIENT_API §8 ``remote``): a few lines about their call, not KCoral's or
urllib3's insides."""

from __future__ import annotations

import secrets
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_process import client_token_file, running_server

from kcoral import Client
from kcoral.errors import RemoteExecutionError


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A CPU server as the README starts one on a shared machine: with a client token."""
    directory = tmp_path_factory.mktemp("short-errors")
    token = secrets.token_hex(16)
    tokens = client_token_file(directory, token + "\n")
    with running_server(directory, ["--auth-token-file", str(tokens)]) as running:
        yield running.url, token


NAPPING_SCRIPT = """
import sys
import kcoral

client = kcoral.Client(sys.argv[1], token=sys.argv[2])


@client.function(serialization=sys.argv[3])
def nap():
    import time

    print("napping", flush=True)  # never shown: the interrupt's answer carries no output
    time.sleep(120)


nap.remote()
print("the script went on")
"""


@pytest.mark.parametrize("serialization", ["json", "pickle"])
def test_ctrl_c_in_a_script_says_the_remote_call_was_cancelled_in_a_few_lines(
    server: tuple[str, str], serialization: str, tmp_path: Path
) -> None:
    # Before, the user read a bare KeyboardInterrupt under about forty lines of urllib3's
    # and http.client's frames, nothing saying what became of the remote call.
    url, token = server
    script = tmp_path / "napping.py"
    script.write_text(NAPPING_SCRIPT)
    out, err = _interrupted_while_the_program_runs(
        url, token, [str(script), url, token, serialization]
    )
    lines = err.strip().splitlines()
    assert lines[-1] == (
        f"KeyboardInterrupt: interrupted: the remote call nap() on {url} was cancelled; "
        "what it printed was not kept"
    )
    assert len(lines) <= 10, err
    assert "urllib3" not in err and "http/client.py" not in err
    assert out == ""


ASYNC_NAPPING_SCRIPT = """
import asyncio
import sys
import kcoral

client = getattr(kcoral, sys.argv[4])(sys.argv[1], token=sys.argv[2])


@client.function(serialization=sys.argv[3])
async def nap():
    import asyncio

    await asyncio.sleep(120)


async def main():
    await nap.remote(run_async=True)
    print("the script went on")


asyncio.run(main())
"""


@pytest.mark.skipif(
    sys.version_info < (3, 11),
    reason="Python 3.10's asyncio.run raises Ctrl-C's KeyboardInterrupt where its loop "
    "waits, outside the remote call",
)
@pytest.mark.parametrize("client_class", ["Client", "AsyncClient"])
@pytest.mark.parametrize("serialization", ["json", "pickle"])
def test_ctrl_c_under_asyncio_run_says_the_remote_call_was_cancelled_as_a_blocking_call_does(
    server: tuple[str, str], serialization: str, client_class: str, tmp_path: Path
) -> None:
    # Before, asyncio.run's Ctrl-C showed the CancelledError's traceback, then "During
    # handling of the above exception, another exception occurred" and a bare
    # KeyboardInterrupt: nothing said what became of the remote call.
    url, token = server
    script = tmp_path / "async_napping.py"
    script.write_text(ASYNC_NAPPING_SCRIPT)
    out, err = _interrupted_while_the_program_runs(
        url, token, [str(script), url, token, serialization, client_class]
    )
    assert err.strip().splitlines()[-1] == (
        f"KeyboardInterrupt: interrupted: the remote call nap() on {url} was cancelled; "
        "what it printed was not kept"
    )
    assert "CancelledError" not in err and "During handling" not in err, err
    assert out == ""


def _interrupted_while_the_program_runs(url: str, token: str, args: list[str]) -> tuple[str, str]:
    """The script's output when SIGINT reached it while its program ran on the server,
    having checked that the server then cancelled the program."""
    with Client(url, token=token) as client:

        def in_progress() -> int:
            return int(client.health()["load"]["requests_in_progress"])

        process = subprocess.Popen(
            [sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            while in_progress() == 0:  # the program has started on the server
                assert process.poll() is None, process.communicate()
                time.sleep(0.05)
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=60)
        finally:
            process.kill()
        for _ in range(300):  # and it is true: the server cancelled the program
            if in_progress() == 0:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the program still runs: {client.health()['load']}")
    return out, err


def failing(x: int) -> None:
    raise ValueError(f"bad {x}")


@pytest.mark.parametrize("serialization", ["json", "pickle"])
def test_a_remote_failure_shows_one_frame_of_kcoral_between_the_call_and_the_remote_traceback(
    server: tuple[str, str], serialization: str
) -> None:
    # Before, three of KCoral's frames (remote, _value, output_value) stood between the
    # user's line and the remote traceback: twenty lines of KCoral's source in a notebook.
    url, token = server
    with Client(url, token=token) as client:
        function = client.function(serialization=serialization)(failing)
        with pytest.raises(RemoteExecutionError) as caught:
            function.remote(1)
    frames = traceback.extract_tb(caught.value.__traceback__)
    kcoral_frames = [frame.name for frame in frames if "/kcoral/" in frame.filename]
    assert kcoral_frames == ["remote"]
    if sys.version_info >= (3, 11):  # the remote traceback is a note (PEP 678)
        assert 'in failing\n    raise ValueError(f"bad {x}")' in caught.value.__notes__[0]
