"""The worker's record of how a program's stdout and stderr interleaved (EXTENSIONS §16).

The two streams are captured into two files (SERVER §9), which keep each stream's bytes but
not how the two interleaved. The worker's ``sys.stdout``/``sys.stderr`` therefore note each
switch from one stream to the other as a *run*: ``(stream, end)``, the stream (1 stdout,
2 stderr) and its file's size when the other stream took over, i.e. every byte of it written
until then, Python's and (between two of Python's writes) native ones alike. The worker
sends its runs in an ``OutputOrder`` frame before ``ProgramFinished`` (and, without a
progress slot, which holds each switch as it happens, before each instruction where they
changed), only once the program wrote to both streams, so a program that prints to one
stream (or nothing) costs nothing.

Who reaches the frame: the program, which runs in the worker and can send any runs. The
front-end reads them by the client's rule (``kcoral.protocol.output_order.runs_of``: a
malformed record is dropped whole, never the program's failure), and the response holds
them in the characters of the texts it returns (``runs_in_characters``), never past them.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from kcoral.protocol.output_order import STDERR, STDOUT
from kcoral_server.processes.ipc import Message

Runs = list[tuple[int, int]]


@dataclass
class OutputOrder(Message):
    """The worker's runs of the program that is about to finish (``[[stream, end], ...]``)."""

    tag: ClassVar[str] = "output_order"
    runs: list[list[int]] = field(default_factory=list)


def wants_output_order(header: str | None) -> bool:
    """Whether a request's ``X-KCoral-Output-Order`` asks for the record (``1``)."""
    return header is not None and header.strip() == "1"


def runs_in_characters(runs: Sequence[tuple[int, int]], stdout: bytes, stderr: bytes) -> Runs:
    """``runs`` (ends in bytes of the files) as ends in characters of the two texts the
    answer returns, ``stdout``/``stderr`` being the bytes those texts were decoded from
    (UTF-8 with replacement, as the answer decodes them). A run that ends inside a character
    ends before it; runs that add nothing are dropped and neighbours of one stream merged."""
    data = {STDOUT: stdout, STDERR: stderr}
    decoders = {s: codecs.getincrementaldecoder("utf-8")(errors="replace") for s in data}
    read = {STDOUT: 0, STDERR: 0}  # bytes consumed per stream
    chars = {STDOUT: 0, STDERR: 0}  # characters those bytes decoded to
    out: Runs = []
    for stream, end in runs:
        end = min(end, len(data[stream]))
        if end <= read[stream]:
            continue
        piece = data[stream][read[stream] : end]
        chars[stream] += len(decoders[stream].decode(piece, final=end == len(data[stream])))
        read[stream] = end
        if out and out[-1][0] == stream:
            out[-1] = (stream, chars[stream])
        else:
            out.append((stream, chars[stream]))
    return out
