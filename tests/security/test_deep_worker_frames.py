"""Attack: a program writes frames nested deeper than JSON's decoder goes to its worker's
channel.

Who can reach what: a program runs in its worker's process and can write any frame on the
worker's channel to the front-end. A frame that is no message fails the channel: the
worker is judged invalid and replaced, the program's request ends, nothing else is
touched. A frame of a few KiB of ``[`` made the decoder raise ``RecursionError`` instead of
the channel's error: it escaped the front-end's reader callback, so every such frame put a
traceback on the server's console (a program looping on it for its whole timeout wrote
hundreds of KiB a second there, the disk the logs share) and was skipped. Real server, the
default sandbox and one-shot workers, tokens for two identities.
"""

from __future__ import annotations

import sys
from pathlib import Path

from identity_support import TOKEN_A, TOKEN_B, token_file

import kcoral

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from e2e_support import module_program

FRAMES = 2000

FLOODER = f"""
import os, socket, struct, sys

def f():
    fd = int(sys.argv[sys.argv.index("--fd") + 1])  # the worker's own channel
    channel = socket.socket(fileno=os.dup(fd))
    payload = b"[" * 5000
    frame = struct.pack(">IH", len(payload), 0) + payload
    try:
        for _ in range({FRAMES}):
            channel.sendall(frame)
    except OSError:
        pass  # the front-end closed the channel: the flood is over
    channel.detach()
    return "sent"
"""


def test_deeply_nested_frames_on_a_worker_channel_fail_their_program_without_a_console_flood(
    server_factory, tmp_path: Path
) -> None:
    tokens = token_file(tmp_path)
    server = server_factory(
        "--sandbox", "auto", "--max-requests-per-worker", "1", "--auth-token-file", str(tokens)
    )
    with kcoral.Client(server.url, token=TOKEN_B) as bob:
        try:
            flooded = bob.execute(module_program(FLOODER, "f"))
        except kcoral.KCoralError as exc:  # the invalid worker's 500
            flooded = exc
    assert getattr(flooded, "status", None) != "COMPLETED", flooded
    with kcoral.Client(server.url, token=TOKEN_A) as alice:
        after = alice.execute(module_program("def f():\n    return 'fine'\n", "f"))
    assert after.status == "COMPLETED", after
    assert after["out"] == "fine"
    console = server.stderr()
    assert "RecursionError" not in console
    assert "Traceback" not in console
