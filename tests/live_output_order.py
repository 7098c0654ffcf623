"""A job followed live while ONE call writes stdout and stderr (EXTENSIONS §16), for the
server's and the router's tests.

The program writes ``out``, ``err``, ``out again`` at once, three turns, and waits after
each turn until the test has seen that turn's lines arrive as events (a gate file it
creates): so what the test sees left by the live polls, never by the job's end, which
orders what is left anyway. Where a gate never opens the program says so and goes on.
"""

from __future__ import annotations

from pathlib import Path

import kcoral

TURNS = 3
SOURCE = r"""
import ctypes
import mmap
import os
import sys
import time

GATES = {gates!r}


def wait_for(turn):
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(GATES, str(turn))):
        if time.monotonic() > deadline:
            print("the test never saw turn", turn, "live")
            return
        time.sleep(0.005)


def spoil(turn):
    # the program's own record in the progress slot, spoiled three ways
    order = sys.stdout.buffer._order
    view = order.shared._view
    if turn == 0:  # a run claiming bytes no file holds
        order.shared.run_written(len(order.runs), 1, 1 << 60)
    elif turn == 1:  # runs to the end of the mapped pages, going backwards, and a count
        # far past them: a reader that trusted it would read past its mapping
        pages = -(-len(view) // mmap.PAGESIZE) * mmap.PAGESIZE
        runs = (2).to_bytes(8, "little") + (-5).to_bytes(8, "little", signed=True)
        ctypes.memmove(ctypes.addressof(view) + 16, runs * ((pages - 16) // 16), pages - 16)
        view[8:16] = (1 << 62).to_bytes(8, "little")
    else:  # a stream that is neither
        order.shared.run_written(0, 7, 3)
    # a line no switch notes: it must still arrive while the program waits
    os.write(2, f"spoiled {{turn}}\n".encode())


def interleaved(spoiling):
    for turn in range({turns}):
        print("out", turn)
        print("err", turn, file=sys.stderr)
        print("out", turn, "again")
        if spoiling:
            spoil(turn)
        wait_for(turn)
    return 1
"""


def live_program(gates: Path, *, spoiling: bool = False) -> kcoral.Program:
    """The interleaving program; ``spoiling``: it also forges its record after each turn."""
    program = kcoral.Program()
    module = program.upload(kind="module", source=SOURCE.format(gates=str(gates), turns=TURNS))
    program.run(fn=program.get_function(module=module, name="interleaved"), args=[spoiling])
    return program


def in_order_written() -> list[tuple[str, str]]:
    """The pieces the program writes, in order (a stream's neighbours merged)."""
    pieces = [("stdout", "out 0\n")]
    for turn in range(TURNS):
        pieces.append(("stderr", f"err {turn}\n"))
        following = f"out {turn + 1}\n" if turn + 1 < TURNS else ""
        pieces.append(("stdout", f"out {turn} again\n{following}"))
    return pieces


def follow(job: kcoral.Job, gates: Path, last_stderr: str = "err") -> list[tuple[str, str]]:
    """The job's output events as pieces (a stream's neighbours merged), opening each
    turn's gate once its lines arrived (``last_stderr``: the word of its last stderr line,
    ``spoiled`` for a spoiling program)."""
    pieces: list[tuple[str, str]] = []
    texts = {"stdout": "", "stderr": ""}
    turn = 0
    for event in job.events():
        if event.kind in ("stdout", "stderr"):
            texts[event.kind] += event.text
            if pieces and pieces[-1][0] == event.kind:
                pieces[-1] = (event.kind, pieces[-1][1] + event.text)
            else:
                pieces.append((event.kind, event.text))
            while (
                turn < TURNS
                and f"out {turn} again\n" in texts["stdout"]
                and f"{last_stderr} {turn}\n" in texts["stderr"]
            ):
                (gates / str(turn)).touch()
                turn += 1
        if event.kind == "phase" and event.finished:
            break
    return pieces
