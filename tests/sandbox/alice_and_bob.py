"""Two token holders on one sandboxed seat: the attacker alice and her neighbour bob.

For the tests where one identity's program attacks what its seat shares with the next
identity's (its fork server, the worker forked ahead, the front-end's channel).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "security"))

from identity_support import token_file
from raw_http import post_execute
from sandbox_helpers import run_source
from server_process import RunningServer, start_server

# The start of a program that attacks its worker's channel to the front-end: it finds the
# channel (the one AF_UNIX socket among its descriptors) as ``channel``.
FIND_THE_CHANNEL = """
import array, os, socket, stat, struct, time

def find_the_channel():
    for fd in range(3, 200):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                channel = socket.socket(fileno=os.dup(fd))
                if channel.family == socket.AF_UNIX:
                    return channel
        except OSError:
            pass
"""

# A program that answers with the name it is given: the seat served its caller.
SAY_WHO = """
def main(who):
    return who
"""


def one_seat_server(tmp_path: Path, options: Sequence[str] = ()) -> RunningServer:
    """A bubblewrap server of one seat, one fresh worker per program (the README's
    default), with alice's and bob's tokens and any other ``options``."""
    tokens = token_file(tmp_path / "secrets")
    return start_server(
        tmp_path / "server",
        [
            "--sandbox", "bubblewrap", "--num-workers", "1", "--max-requests-per-worker", "1",
            "--auth-token-file", str(tokens), *options,
        ],
    )  # fmt: skip


def completed_value(url: str, token: str, source: str, args: list, timeout: float = 110) -> Any:
    """What ``main(*args)`` of ``source`` returned, asserting the program completed."""
    answer = post_execute(
        url,
        run_source(source, args=args),
        headers={"Authorization": f"Bearer {token}"},
        timeout=timeout,
    )
    assert answer.status == 200, answer.raw[-2000:]
    assert answer.body["status"] == "COMPLETED", answer.raw[-2000:]
    return answer.body["results"]["value"]["value"]
