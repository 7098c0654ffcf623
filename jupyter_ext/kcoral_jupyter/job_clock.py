"""How long a cell's job has waited or run, said live on its status line with its job.

A line that said only ``kcoral: running`` for minutes could not tell a user whether the job
was stuck, how long it had run, or which job to cancel in the panel. While the cell's code
runs the line says ``running 2 min 10 s · job 3f9c1a2b`` (the job's running time since a
worker took it, queue wait not counted; the 8 characters the panel's output pane names a
job by), and while it waits ``queued behind 2 · 5 s · job 3f9c1a2b`` (since its
submission) or ``waiting for GPU · 5 s · job …`` (since that wait began). Other phases pass
in a moment and keep their words. ``%kcoral attach`` counts from the job's own
``submitted_at`` and ``started_at`` (``JobClock.of_job``): its events replay at once.

The line is said again only when its text changes: each second for the first minute, each
10 s to 10 minutes (``2 min 10 s``), then each minute (``12 min``), the panel's way of
writing a duration. An hour's cell updates its line about 170 times, never a flood of a
notebook's output messages. The job's events are read in a thread (``events_with_ticks``)
so that the line can tick while no event comes; every display stays on the caller's thread.
"""

from __future__ import annotations

import datetime
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kcoral.connection.event_stream import JobEvent

#: (under this many seconds, the line is said again each this many seconds)
TICKS = ((60.0, 1.0), (600.0, 10.0), (math.inf, 60.0))

#: The phases that wait, said with how long they have waited; the cell's code running is
#: said with how long the job has run.
WAITING, RUNNING = "waiting", "running"


def tick_seconds(seconds: float) -> float:
    """How often a line ``seconds`` into its phase changes its words."""
    return next(step for below, step in TICKS if seconds < below)


def said_time(seconds: float) -> str:
    """``14 s``, ``2 min 10 s``, ``12 min``: floored to the line's tick, so that what it
    says was true when it was said; "" in the first second (``running 0 s`` on a terminal,
    which prints a line once, would stay said)."""
    whole = int(seconds // tick_seconds(seconds) * tick_seconds(seconds))
    if whole < 1:
        return ""
    if whole < 60:
        return f"{whole} s"
    minutes, rest = divmod(whole, 60)
    return f"{minutes} min {rest} s" if minutes < 10 else f"{minutes} min"


class JobClock:
    """The live line of one job's phases: its words, the time its phase is counted from,
    and the job's id."""

    def __init__(self, job_id: str | None, submitted: float) -> None:
        self.job_id = job_id
        self.submitted = submitted  # time.monotonic() when the submission was answered
        self.assigned: float | None = None  # when a worker took it: its running time starts
        self.text = ""
        self.kind: str | None = None  # WAITING, RUNNING, or None: a phase said as it is
        self.since = submitted
        #: the job's own start time is known (``of_job``): its replayed ``assigned`` is not
        self.started_known = False

    @classmethod
    def of_job(cls, job_id: str, state: Mapping[str, Any]) -> JobClock:
        """The clock of a job submitted before (``%kcoral attach``), set by its state's
        ``submitted_at`` and ``started_at``: its events, replayed at once, said no time (or
        would count it from the attach). The server's clock is taken as ours; a time it
        says in our future counts from now."""
        now = time.monotonic()
        submitted = ago(state.get("submitted_at"))
        clock = cls(job_id, now - (submitted or 0.0))
        started = ago(state.get("started_at"))
        if started is not None:
            clock.assigned, clock.started_known = now - started, True
        return clock

    def waiting(self, text: str, since: float | None = None) -> str:
        """``text`` said with how long it has waited, from ``since`` (default: now; a
        submission held by a router before the job has an id); the line it makes now."""
        now = time.monotonic()
        self.text, self.kind, self.since = text, WAITING, now if since is None else since
        return self.line(now)

    def phase(self, data: Mapping[str, Any], text: str) -> str:
        """Note the ``phase`` event ``data`` said as ``text``; the line it makes now."""
        now = time.monotonic()
        name = data.get("phase") or data.get("name")
        self.text, self.kind = text, None
        if name == "queued":
            # a job that has started said its queue wait replayed: past, said with no time
            if not self.started_known:
                self.kind, self.since = WAITING, self.submitted
        elif name == "assigned":
            if not self.started_known:  # a replayed one comes at the attach, not at its start
                self.assigned = now
        elif name == "lease_wait":
            self.kind, self.since = WAITING, now
        elif name == "instruction" and data.get("id") == "cell":
            self.kind, self.since = RUNNING, self.assigned if self.assigned is not None else now
        return self.line(now)

    def line(self, now: float | None = None) -> str:
        """The phase's words, with how long it has waited or run and the job's id."""
        if self.kind is None:
            return self.text
        seconds = (time.monotonic() if now is None else now) - self.since
        elapsed = said_time(seconds)
        if not elapsed:
            pieces = [self.text]
        elif self.kind == RUNNING:  # "running 2 min 10 s"
            pieces = [f"{self.text} {elapsed}"]
        else:  # "queued behind 2 · 5 s"
            pieces = [self.text, elapsed]
        if self.job_id:
            pieces.append(f"job {self.job_id[:8]}")
        return " · ".join(pieces)

    def seconds_to_tick(self) -> float | None:
        """How long until the line's words change (``None``: never, a phase said as is)."""
        if self.kind is None:
            return None
        seconds = max(0.0, time.monotonic() - self.since)
        step = tick_seconds(seconds)
        return (seconds // step + 1) * step - seconds + 0.01


def ago(stamp: object) -> float | None:
    """How many seconds ago the server's RFC 3339 ``stamp`` was (0 for one in our future);
    ``None`` for no stamp or one that is not a time."""
    if not isinstance(stamp, str):
        return None
    try:
        then = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if then.tzinfo is None:
        return None
    return max(0.0, time.time() - then.timestamp())


#: what the thread puts last, once the events have ended
_ENDED = object()


def events_with_ticks(
    events: Iterator[JobEvent], seconds_to_tick: Callable[[], float | None]
) -> Iterator[JobEvent | None]:
    """The job's ``events``, read in a daemon thread, with ``None`` between them whenever
    ``seconds_to_tick`` passes without one. What the reading raises is raised here. A caller
    that stops early leaves the thread to read the stream to its end (it ends right after
    the ``finished`` phase, or when the cancelled job finishes)."""
    box: queue.Queue[object] = queue.Queue()

    def pump() -> None:
        try:
            for event in events:
                box.put(event)
        except BaseException as error:  # an interrupt included: handed to the caller
            box.put(error)
        else:
            box.put(_ENDED)

    threading.Thread(target=pump, name="kcoral-job-events", daemon=True).start()
    while True:
        try:
            item = box.get(timeout=seconds_to_tick())
        except queue.Empty:
            yield None
            continue
        if item is _ENDED:
            return
        if isinstance(item, BaseException):
            raise item
        assert isinstance(item, JobEvent)
        yield item
