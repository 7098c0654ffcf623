"""A program that sends the front-end one message larger than any answer (SERVER §14;
2026-12, sandbox sweep).

The attacker is a token holder's program on the default sandboxed server. Its worker's
channel to the front-end is a descriptor of its own process, and the front-end read a
message of up to 512 MiB whole before it looked inside: one of 200 MB took it (which serves
every identity) to 1.28 GB. Now a message past what an answer may carry
(``--max-response-bytes`` and an envelope) is refused at its head, as the answer too large.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from alice_and_bob import FIND_THE_CHANNEL, SAY_WHO, completed_value, one_seat_server
from identity_support import TOKEN_A, TOKEN_B
from kcoral_server.processes import sandbox
from raw_http import post_execute
from sandbox_helpers import run_source

BWRAP_PROBLEM = sandbox.probe()

MAX_RESPONSE_BYTES = 1024 * 1024
MESSAGE_BYTES = 96 * 1024 * 1024  # past this server's limit, well under the old 512 MiB

# Announces a message of MESSAGE_BYTES and sends all of it (the front-end used to take it).
SEND_AN_OVERSIZED_MESSAGE = (
    FIND_THE_CHANNEL
    + f"""
def main():
    channel = find_the_channel()
    channel.sendall(struct.pack(">IH", {MESSAGE_BYTES}, 0))
    chunk = b"x" * (1 << 20)
    for _ in range({MESSAGE_BYTES} >> 20):
        channel.sendall(chunk)
    time.sleep(15)
"""
)


def _peak_memory_bytes(pid: int) -> int:
    """The process's peak resident memory so far (``VmHWM``)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=f"bubblewrap cannot run: {BWRAP_PROBLEM}")
def test_a_message_larger_than_any_answer_is_refused_before_the_front_end_holds_it(
    tmp_path: Path,
) -> None:
    server = one_seat_server(tmp_path, ["--max-response-bytes", str(MAX_RESPONSE_BYTES)])
    try:
        before = _peak_memory_bytes(server.process.pid)
        answer = post_execute(
            server.url,
            run_source(SEND_AN_OVERSIZED_MESSAGE),
            headers={"Authorization": f"Bearer {TOKEN_A}"},
            timeout=110,
        )
        assert answer.status == 500, answer.raw[-2000:]
        assert answer.body["error"]["kind"] == "response_too_large"
        assert answer.body["error"]["message"] == (
            f"results exceed the configured response-size limit: {MESSAGE_BYTES} bytes, "
            f"limit {MAX_RESPONSE_BYTES} bytes (max_response_bytes; kcoral server "
            "--max-response-bytes)"
        )
        assert _peak_memory_bytes(server.process.pid) - before < MESSAGE_BYTES // 2
        assert completed_value(server.url, TOKEN_B, SAY_WHO, ["bob"]) == "bob"
    finally:
        server.stop()
