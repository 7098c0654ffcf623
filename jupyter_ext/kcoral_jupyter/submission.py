"""A cell's submission said live on its status line, until the server answers with its job.

A router holds a submission while every seat of its kind is busy: the line said
``submitting, waiting for gpu=h100`` for minutes, with no time where every later line says
one (``job_clock``); it now ticks as they do (``… · 5 s``). A large body (a ``--folder`` of
100 MiB, a big tensor) said nothing while it went: the client draws its progress only on a
terminal's stderr (``kcoral.connection.upload_progress``), which a notebook's is not. Its
counts now come through the client's ``upload_watcher`` and the line says
``uploading 40.0 MiB of 100.0 MiB``, replaced in place, a few times a second at most; a
body under ``UPLOAD_PROGRESS_BYTES`` says nothing.

The submission runs in a thread; the cell's thread says what it reports, so that every
display stays on the cell's thread (a display from another may land in another cell). An
interrupt the cell's thread raises (a second one, ``runner.HeldInterrupt``) abandons the
submission: its connection is cut (``kcoral.connection.in_flight``), as an interrupt on the
cell's own thread closed it, so a submission a router holds is dropped there and a large
upload stops; a submission already sent may still become a job, as the cell then says.
Before, the thread went on: a router's held submission became a job once a seat freed,
minutes after the cell said it was interrupted, with nobody following it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar, cast

from kcoral.connection.in_flight import InFlight, running
from kcoral.connection.upload_progress import upload_watcher
from kcoral.run.progress import format_bytes
from kcoral_jupyter.job_clock import JobClock

if TYPE_CHECKING:
    from kcoral_jupyter.runner import Reporter

#: an upload's line is said again at most this often (a 4 GiB body has 4096 pieces)
UPLOAD_REDRAW_SECONDS = 0.25


#: what a submission gives back: its job
SubmittedJob = TypeVar("SubmittedJob")


class SubmissionAbandoned(Exception):
    """Raised in the upload of a submission its cell was interrupted out of."""


def upload_text(sent: int, total: int) -> str:
    """``uploading 40.0 MiB of 100.0 MiB``, then ``uploaded 100.0 MiB`` (the server reads
    it before it answers)."""
    if sent >= total:
        return f"uploaded {format_bytes(total)}"
    return f"uploading {format_bytes(sent)} of {format_bytes(total)}"


def submitted_live(
    submit: Callable[[], SubmittedJob],
    reporter: Reporter,
    waits_for: str | None,
    said_by_the_client: Callable[[Callable[[str], None] | None], None] | None = None,
) -> SubmittedJob:
    """``submit()``'s job, its wait and upload said on ``reporter`` meanwhile.
    ``said_by_the_client`` sets where the client says a wait of its own (a session's
    ``on_wait``): its words come through here to the cell's thread."""
    upload_redraw_seconds = UPLOAD_REDRAW_SECONDS  # read once: a test may set it
    box: queue.Queue[tuple[str, Any]] = queue.Queue()
    abandoned = threading.Event()
    clock = JobClock(None, time.monotonic())
    # the first count a redraw's time into the upload: one on loopback says only its end
    last_put = [time.monotonic()]

    def watch(sent: int, total: int) -> None:
        if abandoned.is_set():
            raise SubmissionAbandoned
        now = time.monotonic()
        if sent >= total or now - last_put[0] >= upload_redraw_seconds:
            last_put[0] = now
            box.put(("upload", (sent, total)))

    flight = InFlight()  # the submission's connection, cut once it is abandoned
    finished: Future[None] = Future()

    def send() -> None:
        upload_watcher.set(watch)  # this thread's own context
        try:
            with running(flight):
                job = submit()
        except BaseException as error:
            box.put(("raised", error))
        else:
            box.put(("job", job))
        finally:
            finished.set_result(None)

    held = f"submitting, waiting for {waits_for}"
    if waits_for:
        reporter.phase(clock.waiting(held))
    if said_by_the_client is not None:
        said_by_the_client(lambda text: box.put(("phase", text)))
    uploading = False
    try:
        threading.Thread(target=send, name="kcoral-submission", daemon=True).start()
        while True:
            try:
                kind, value = box.get(timeout=clock.seconds_to_tick())
            except queue.Empty:
                reporter.tick(clock.line())
                continue
            if kind == "job":
                return cast(SubmittedJob, value)
            if kind == "raised":
                raise cast(BaseException, value)
            if kind == "phase":
                reporter.phase(clock.phase({}, str(value)))
            elif kind == "upload":
                sent, total = value
                # said as it is, no tick over it; a router's hold is said again once it is sent
                text = clock.phase({}, upload_text(sent, total))
                # its counts tick (a terminal rewrites them where it can); its end is said
                (reporter.tick if uploading and sent < total else reporter.phase)(text)
                uploading = True
                if sent >= total and waits_for:  # counted from the submission's start
                    reporter.phase(clock.waiting(held, since=clock.submitted))
    except BaseException:
        abandoned.set()
        flight.cut(finished)
        raise
    finally:
        if said_by_the_client is not None:
            said_by_the_client(None)
