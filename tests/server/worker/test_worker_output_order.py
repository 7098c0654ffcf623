"""The worker's record of how a program's stdout and stderr interleaved (EXTENSIONS §16):
runs ``[stream, end]``, the end a size of that stream's capture file, reported before each
instruction where it changed and once more before ``ProgramFinished``; nothing for a program
that wrote to one stream only. A real worker process (``worker_harness``)."""

from __future__ import annotations

from kcoral_server.processes.output_order import OutputOrder
from kcoral_server.processes.progress_slot import ProgressSlot
from worker_harness import call, function, module

from kcoral.protocol.output_order import MAX_RUNS

SOURCE = """
import os, sys

def mixed():
    print("out")                      # stdout 0..4
    os.write(1, b"native\\n")         # stdout 4..11: a native write, no switch
    sys.stderr.write("err\\n")        # stderr 0..4
    sys.stdout.buffer.write(b"buf\\n")  # stdout 11..15, through the binary layer
    return 1

def quiet():
    print("one stream")
    return 1
"""


def test_the_worker_reports_each_switch_at_its_streams_size(shared_worker) -> None:
    result = shared_worker.run([module("m", SOURCE), function("f", "m", "mixed"), call("r", "f")])
    assert result.finished.status == "COMPLETED", result.error
    assert result.output_order == [[1, 11], [2, 4], [1, 15]]
    assert (result.stdout, result.stderr) == ("out\nnative\nbuf\n", "err\n")
    # the whole record arrives before ProgramFinished
    kinds = [type(message) for message in result.messages]
    assert kinds.index(OutputOrder) < len(kinds) - 1


def test_a_program_writing_one_stream_sends_no_record(shared_worker) -> None:
    result = shared_worker.run([module("m", SOURCE), function("f", "m", "quiet"), call("r", "f")])
    assert result.finished.status == "COMPLETED", result.error
    assert not any(isinstance(message, OutputOrder) for message in result.messages)


def test_a_worker_with_a_progress_slot_sends_its_record_once_not_per_instruction(
    start_worker,
) -> None:
    # each frame holds every run so far: one per instruction made a program of many calls
    # writing both streams send (and the front-end's event loop read) a quadratic amount
    worker = start_worker()
    slot, fd = ProgressSlot.create()
    calls = [call(f"r{index}", "f") for index in range(5)]
    result = worker.run([module("m", SOURCE), function("f", "m", "mixed"), *calls], progress_fd=fd)
    assert result.finished.status == "COMPLETED", result.error
    frames = [message for message in result.messages if isinstance(message, OutputOrder)]
    assert len(frames) == 1
    # the slot holds each switch as it happened, the frame the whole record at the end
    switches = slot.runs_since(0, MAX_RUNS)
    assert len(switches) == 5 * 2  # out, err, out again: two switches a call
    assert [tuple(run) for run in frames[0].runs] == [*switches, (1, 5 * 15)]
    slot.close()
