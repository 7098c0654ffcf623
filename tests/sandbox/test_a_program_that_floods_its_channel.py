"""A program that sends the front-end descriptors over its worker's channel (SERVER §8;
2026-12, sandbox sweep).

The attacker is a token holder's program on the default sandboxed server. Its worker's
channel to the front-end is a descriptor of its own process, and descriptors sent there
with no frame to claim them were kept: 100 messages of 250 filled the front-end's table
(20000), and it accepted no one's connection until the program ended. Now the channel
breaks at the first descriptor past one frame's worth, as for any unreadable reply.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from alice_and_bob import FIND_THE_CHANNEL, SAY_WHO, completed_value, one_seat_server
from identity_support import TOKEN_A, TOKEN_B
from kcoral_server.processes import sandbox
from kcoral_server.processes.ipc import MAX_FDS_PER_FRAME
from raw_http import post_execute
from sandbox_helpers import run_source

BWRAP_PROBLEM = sandbox.probe()

# Finds its channel (the one AF_UNIX socket among its descriptors), starts a frame that
# never ends, sends 250 descriptors with each byte, then holds the channel open a while.
FLOOD_THE_CHANNEL = (
    FIND_THE_CHANNEL
    + """
def main():
    channel = find_the_channel()
    nulls = array.array("i", [os.open("/dev/null", os.O_RDONLY) for _ in range(250)])
    channel.sendall(struct.pack(">IH", 100000, 0))
    try:
        for _ in range(100):
            channel.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, nulls)])
    except OSError:
        pass
    time.sleep(15)
"""
)


def _open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=f"bubblewrap cannot run: {BWRAP_PROBLEM}")
def test_descriptors_a_program_sends_on_its_channel_never_fill_the_front_ends_table(
    tmp_path: Path,
) -> None:
    server = one_seat_server(tmp_path)
    try:
        answers = []

        def attack() -> None:
            answers.append(
                post_execute(
                    server.url,
                    run_source(FLOOD_THE_CHANNEL),
                    headers={"Authorization": f"Bearer {TOKEN_A}"},
                    timeout=110,
                )
            )

        attacker = threading.Thread(target=attack)
        attacker.start()
        most = 0
        while attacker.is_alive():
            most = max(most, _open_descriptors(server.process.pid))
            time.sleep(0.1)
        attacker.join()
        assert most < 2 * MAX_FDS_PER_FRAME + 200, most
        (answer,) = answers
        assert answer.status == 500, answer.raw[-2000:]
        assert answer.body["error"]["message"] == "invalid worker response"
        assert completed_value(server.url, TOKEN_B, SAY_WHO, ["bob"]) == "bob"
    finally:
        server.stop()
