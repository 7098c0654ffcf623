"""The progress line of a large request body (CLIENT_API §2): ``Client.execute`` of a
program with a 4 GiB folder said nothing for the minute its body took to send.

A body of ``UPLOAD_PROGRESS_BYTES`` or more is sent in pieces of at most 1 MiB with
``kcoral run``'s one-line display on stderr (``kcoral.run.progress``): silent when stderr is
not a terminal (pipes, logs, a notebook's stream), and while another progress line is drawn
there (``kcoral run``'s own). Smaller bodies go as they are, silently.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TextIO

from kcoral.connection.transport import body_pieces
from kcoral.protocol.multipart import BodyChunk
from kcoral.run.progress import Progress

#: Bodies from this size on show a progress line while they are sent.
UPLOAD_PROGRESS_BYTES = 64 << 20
_PIECE_BYTES = 1 << 20  # a redraw per MiB at most: smooth on a slow link, cheap on a fast one


def sent_with_progress(
    chunks: Iterable[BodyChunk], total: int, stream: TextIO | None = None
) -> Iterator[bytes | memoryview]:
    """The body's pieces, counted on a progress line as each one has been sent (the
    consumer asks for the next piece once the previous one is on its way); the line is
    finished when the last piece is taken, erased when sending stops short."""
    with Progress("kcoral: upload", total, sys.stderr if stream is None else stream) as progress:
        for piece in body_pieces(chunks):
            if not progress.enabled:
                yield piece
                continue
            view = memoryview(piece)
            for start in range(0, view.nbytes, _PIECE_BYTES):
                part = view[start : start + _PIECE_BYTES]
                yield part
                progress.advance(part.nbytes)
