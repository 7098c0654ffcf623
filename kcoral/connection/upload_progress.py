"""The progress line of a large request body (CLIENT_API §2): ``Client.execute`` of a
program with a 4 GiB folder said nothing for the minute its body took to send.

A body of ``UPLOAD_PROGRESS_BYTES`` or more is counted piece by piece as it is sent (the
pieces of ``body_pieces``, at most ``PIECE_BYTES`` each: a redraw per MiB at most) with
``kcoral run``'s one-line display on stderr (``kcoral.run.progress``): silent when stderr is
not a terminal (pipes, logs, a notebook's stream), and while another progress line is drawn
there (``kcoral run``'s own). Smaller bodies go as they are, silently. A notebook says it
on the cell's status line instead (``upload_watcher``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import TextIO

from kcoral.run.progress import Progress

#: Bodies from this size on show a progress line while they are sent.
UPLOAD_PROGRESS_BYTES = 64 << 20


def sent_with_progress(
    pieces: Iterable[bytes | memoryview], total: int, stream: TextIO | None = None
) -> Iterator[bytes | memoryview]:
    """The body's ``pieces`` (``body_pieces``'), counted on a progress line as each one has
    been sent (the consumer asks for the next piece once the previous one is on its way);
    the line is finished when the last piece is taken, erased when sending stops short."""
    watcher = upload_watcher.get()
    if watcher is not None:  # a notebook's status line says it instead (stderr is no terminal)
        yield from watched(pieces, total, watcher)
        return
    with Progress("kcoral: upload", total, sys.stderr if stream is None else stream) as progress:
        for piece in pieces:
            yield piece
            if progress.enabled:
                progress.advance(len(piece) if isinstance(piece, bytes) else piece.nbytes)


#: What shows a large body's progress instead of the line on stderr, called with the bytes
#: sent and the total after each piece, on the sending thread: a notebook's status line sets
#: it around a cell's submission (kcoral_jupyter.submission); it may raise to stop the upload.
upload_watcher: ContextVar[Callable[[int, int], None] | None] = ContextVar(
    "kcoral_upload_watcher", default=None
)


def watched(
    pieces: Iterable[bytes | memoryview], total: int, watcher: Callable[[int, int], None]
) -> Iterator[bytes | memoryview]:
    """The body's ``pieces``, each counted to ``watcher`` once it has been sent."""
    sent = 0
    for piece in pieces:
        yield piece
        sent += len(piece) if isinstance(piece, bytes) else piece.nbytes
        watcher(sent, total)
