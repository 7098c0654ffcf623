"""Two token holders on one sandboxed seat: the attacker alice and her neighbour bob.

For the tests where one identity's program attacks what its seat shares with the next
identity's (its fork server, the worker forked ahead, the front-end's channel).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "security"))

from identity_support import token_file
from raw_http import post_execute
from sandbox_helpers import run_source
from server_process import RunningServer, start_server

# A program that answers with the name it is given: the seat served its caller.
SAY_WHO = """
def main(who):
    return who
"""


def one_seat_server(tmp_path: Path) -> RunningServer:
    """A bubblewrap server of one seat, one fresh worker per program (the README's
    default), with alice's and bob's tokens."""
    tokens = token_file(tmp_path / "secrets")
    return start_server(
        tmp_path / "server",
        [
            "--sandbox", "bubblewrap", "--num-workers", "1", "--max-requests-per-worker", "1",
            "--auth-token-file", str(tokens),
        ],
    )  # fmt: skip


def completed_value(url: str, token: str, source: str, args: list) -> Any:
    """What ``main(*args)`` of ``source`` returned, asserting the program completed."""
    answer = post_execute(
        url,
        run_source(source, args=args),
        headers={"Authorization": f"Bearer {token}"},
        timeout=110,
    )
    assert answer.status == 200, answer.raw[-2000:]
    assert answer.body["status"] == "COMPLETED", answer.raw[-2000:]
    return answer.body["results"]["value"]["value"]
