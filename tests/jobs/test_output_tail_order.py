"""A job's output leaves in the order written (EXTENSIONS §16) also where one run of a
stream is longer than a read of it (``MAX_READ_BYTES``, 4 MiB): a phase or the job's end
sent 4 MiB of that run, then each stream's rest, stdout first, so ``out again``, written
after ``err``, came before it. ``OutputTail`` on real capture files, the worker's record
standing in for its progress slot; the live poll is not started, so only the phase or the
end sends."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kcoral_server.jobs.output_stream import MAX_READ_BYTES, OutputTail

from kcoral.protocol.output_order import STDERR, STDOUT, Run

LONG_RUN = b"x" * (MAX_READ_BYTES + (1 << 20))


class Record:
    """The runs a worker wrote into its progress slot: ``runs_since`` as the slot reads."""

    def __init__(self, runs: list[Run]) -> None:
        self.runs = runs

    def runs_since(self, first: int, most: int) -> list[Run]:
        return self.runs[first : first + most]


def tail_of_a_long_run_then_a_switch(directory: Path) -> tuple[OutputTail, list[tuple[str, str]]]:
    """stdout: the long run, then ``out again``; stderr: ``err`` written between them."""
    (directory / "out").write_bytes(LONG_RUN + b"out again\n")
    (directory / "err").write_bytes(b"err\n")
    pieces: list[tuple[str, str]] = []

    def emit(stream: str, text: str) -> None:
        if pieces and pieces[-1][0] == stream:
            pieces[-1] = (stream, pieces[-1][1] + text)
        else:
            pieces.append((stream, text))

    tail = OutputTail(directory / "out", directory / "err", 16 << 20, emit)
    tail.record = Record([(STDOUT, len(LONG_RUN)), (STDERR, 4)])
    return tail, pieces


IN_ORDER = [("stdout", LONG_RUN.decode()), ("stderr", "err\n"), ("stdout", "out again\n")]


def test_a_phase_sends_a_run_longer_than_one_read_whole_before_the_switch_after_it(
    tmp_path: Path,
) -> None:
    tail, pieces = tail_of_a_long_run_then_a_switch(tmp_path)
    tail.catch_up((len(LONG_RUN) + 10, 4))
    assert pieces == IN_ORDER
    tail.close()


def test_the_end_of_a_job_sends_a_run_longer_than_one_read_whole_before_the_switch_after_it(
    tmp_path: Path,
) -> None:
    tail, pieces = tail_of_a_long_run_then_a_switch(tmp_path)
    asyncio.run(tail.finish())
    assert pieces == IN_ORDER
