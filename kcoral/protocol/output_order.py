"""The order of a program's stdout and stderr (EXTENSIONS §16), for both sides.

An answer carries the two streams apart (PROTOCOL §7.2), so ``print("a");
print("warn", file=sys.stderr); print("b")`` read as ``a``, ``b`` and then ``warn``. A
client that sends ``X-KCoral-Output-Order: 1`` gets ``output_order`` beside them: *runs*
``[stream, end]``, the stream (1 stdout, 2 stderr) and the character of that stream's text
where the run ends, in the order they were written. ``interleave`` puts the two texts
together by it.

Who writes the record: the server, which may be broken or hostile, and the program, which
can forge its own. So a record is only ever a hint for the order: ``runs_of`` keeps a
well-formed record and drops any other whole (never an error: the texts are still good),
and ``interleave`` returns every character of both texts exactly once whatever the runs
say, ends past a text or going backwards included.
"""

from __future__ import annotations

from typing import Any

#: The request header asking for ``output_order`` (its one value: ``1``).
OUTPUT_ORDER_HEADER = "X-KCoral-Output-Order"
#: The most runs a record holds; a longer one is not a server's of ours, and is dropped.
MAX_RUNS = 10_000
STDOUT, STDERR = 1, 2
STREAM_NAMES = {STDOUT: "stdout", STDERR: "stderr"}

Run = tuple[int, int]


def runs_of(value: Any) -> tuple[Run, ...]:
    """A response's ``output_order`` as runs; ``()`` for an absent or malformed one."""
    if not isinstance(value, list) or len(value) > MAX_RUNS:
        return ()
    runs: list[Run] = []
    for run in value:
        if (
            not isinstance(run, list)
            or len(run) != 2
            or type(run[0]) is not int
            or run[0] not in STREAM_NAMES
            or type(run[1]) is not int
        ):
            return ()
        runs.append((run[0], run[1]))
    return tuple(runs)


def interleave(stdout: str, stderr: str, runs: tuple[Run, ...]) -> list[tuple[str, str]]:
    """``(stream name, text)`` pieces of both texts in the order ``runs`` say, then what no
    run covers: stdout's rest, then stderr's. Each text is the concatenation of its
    pieces, whatever ``runs`` hold."""
    texts = {STDOUT: stdout, STDERR: stderr}
    done = {STDOUT: 0, STDERR: 0}
    # (stream, its pieces' ends): a run of the stream that left last moves that end on, so
    # 10,000 runs of one stream (a malicious server's) copy its text once, not 10,000 times
    spans: list[tuple[int, int, int]] = []  # (stream, start, end)

    def emit(stream: int, end: int) -> None:
        end = min(end, len(texts[stream]))
        if end <= done[stream]:
            return  # nothing new: an end behind the last, or past a text already shown
        if spans and spans[-1][0] == stream:
            spans[-1] = (stream, spans[-1][1], end)
        else:
            spans.append((stream, done[stream], end))
        done[stream] = end

    for stream, end in runs:
        emit(stream, end)
    emit(STDOUT, len(stdout))
    emit(STDERR, len(stderr))
    return [(STREAM_NAMES[stream], texts[stream][start:end]) for stream, start, end in spans]
