"""The line a running cell shows, updated in place, and the provenance its outputs carry.

Its final text is the summary a saved notebook keeps (``summary_text``); every output of a
cell carries ``provenance`` in its metadata under the key ``kcoral``. The HTML is the
display module's (``display.status_line_bundle``). While the cell runs, the line's metadata
also says ``"live": true``: a kernel that restarts then never updates it again, and
JupyterLab's extension (``labextension/src/restarts.ts``) rewrites such a line to say so.
"""

from __future__ import annotations

import shutil
import sys
from typing import Any

from IPython.core.displaypub import DisplayPublisher
from IPython.core.getipython import get_ipython
from IPython.display import DisplayHandle, display

from kcoral import ProgramResult
from kcoral.run.terminal_filter import StandardStreams, screened, utf8_writable
from kcoral_jupyter import display as rich
from kcoral_jupyter.kernel_state import ServerFacts
from kcoral_jupyter.runner import RunRecord


class StatusLine:
    """One line updated in place; its final text is the summary a saved notebook keeps."""

    def __init__(self, enabled: bool, record: RunRecord, *, local_server: bool = False) -> None:
        self.enabled = enabled
        self.record = record  # a live line's provenance is read from it again at each phase
        #: the final line's provenance (its result's, once there is one)
        self.metadata = provenance(None, record)
        self.local_server = local_server  # it runs on this kernel's own server (ends with it)
        self.handle: DisplayHandle | None = None
        self.sent: tuple[dict[str, Any], dict[str, Any]] | None = None  # the display's now
        self.text = ""
        self.live = False
        self.in_place = updates_in_place()
        self.printed: str | None = None  # a terminal's last line: the same one is not repeated
        #: the terminal's last line is ours, nothing written after it: a tick may rewrite it
        self.last_line_ours = False
        #: the stream the cell's output last went to, and whether that write ended a line
        self.last_stream: str | None = None
        self.last_ended_line = True
        #: a terminal IPython gets the program's colours, never the escapes a server could
        #: use on the terminal (kcoral.run.terminal_filter); a notebook renders only colours
        self.screens = StandardStreams()

    def show(
        self,
        text: str,
        *,
        status: str | None = None,
        warning: str | None = None,
        live: bool = False,
    ) -> None:
        """Show ``text``; a ``warning`` (said within ``text``) styles it as one (amber, a
        warning sign), and a quiet line still writes the warning to stderr: never hidden.
        ``live``: the cell still runs and will update it (a phase)."""
        self.text = text
        self.live = live
        if not self.enabled:
            if warning:
                sys.stderr.write(f"kcoral: warning: {warning}\n")
            return
        data = rich.status_line_bundle(text, status=status, warning=bool(warning))
        shown = self.metadata
        if live:  # with its job, once submitted
            shown = {
                **provenance(None, self.record),
                "live": True,
                "local_server": self.local_server,
            }
        metadata = {"kcoral": shown}
        if not self.in_place and status in ("ERROR", "TIMED_OUT"):
            # A terminal: the error printed next says these words; the line repeated them.
            self.restore_terminal()
            return
        if not self.in_place:  # each update would print a new line: print each one once
            # printed as it is on a terminal: a server's text in it (a refusal's message)
            # screened, as the cell's output is
            data = {**data, "text/plain": screened(data["text/plain"])}
            self.restore_terminal()
            if data["text/plain"] != self.printed:
                self.printed = data["text/plain"]
                if not self.last_ended_line:  # the cell's output left a line unfinished
                    self._write(self.last_stream or "stdout", "\n")
                display(data, raw=True, metadata=metadata)
                self.last_line_ours = True
        elif self.handle is None:
            self.handle = display(data, raw=True, metadata=metadata, display_id=True)
            self.sent = (data, metadata)
        elif (data, metadata) != self.sent:  # a phase said twice (loading the cell) is one
            self.handle.update(data, raw=True, metadata=metadata)
            self.sent = (data, metadata)

    def replaced_by(self, data: dict[str, str], metadata: dict[str, Any]) -> None:
        """Show ``data`` in the line's place where it was shown and updates in place (a
        ``--noblock`` cell's submitted job, after its upload's progress), else below it."""
        if self.handle is not None:
            self.handle.update(data, raw=True, metadata=metadata)
        else:
            display(data, raw=True, metadata=metadata)

    def settle(self) -> None:
        """The line as it stands, no longer live: the cell ended without a last word."""
        if self.live:
            self.show(self.text)
        self.restore_terminal()

    def restore_terminal(self) -> None:
        """On a terminal, undo what the program's output left set (colours, a hidden
        cursor: ``TerminalFilter.restore``) before a line of ours and at the cell's end."""
        self.screens.restore()

    # Reporter protocol (runner.Reporter)
    def phase(self, text: str) -> None:
        self.show(text, live=True)

    def tick(self, text: str) -> None:
        """The running phase's line a later time in it (``job_clock``): replaced in place. A
        terminal, where each update is a new line (a line a second flooded it), gets its
        last line rewritten while that is this line, on one row, and nothing came after it;
        else the line it printed as the phase began stays."""
        if self.in_place:
            self.show(text, live=True)
        elif self.enabled and self.last_line_ours and fits_one_row(f"kcoral: {text}"):
            sys.stdout.write(REWRITE_LAST_LINE)
            self.printed = None
            self.show(text, live=True)

    def finished(self, text: str) -> None:
        """``done (STATUS)``: a notebook shows it until the summary replaces it; a terminal
        keeps it back, as the summary (or error) line that follows says the status again
        (``settle`` prints it when none follows)."""
        if self.in_place:
            self.show(text, live=True)
        else:
            self.text, self.live = text, True

    def stdout(self, text: str) -> None:
        self._write("stdout", text)

    def stderr(self, text: str) -> None:
        self._write("stderr", text)

    def note(self, text: str) -> None:
        """Write a note of the extension's (one line) to stderr, starting on a line of its
        own even where the cell's output ended without a newline."""
        self.restore_terminal()
        self.stderr(("\n" if self._note_would_join_a_line() else "") + text)

    def _write(self, stream: str, text: str) -> None:
        if not text:
            return
        out = sys.stdout if stream == "stdout" else sys.stderr
        text = self.screens.screen(stream, out, utf8_writable(text))
        if not text:
            return
        out.write(text)
        out.flush()
        self.last_line_ours = False
        self.last_stream, self.last_ended_line = stream, text.endswith("\n")

    def _note_would_join_a_line(self) -> bool:
        # A terminal shows both streams on one screen, so any unfinished last line takes the
        # note; a notebook keeps stdout and stderr apart, joining only consecutive stderr.
        if self.last_ended_line:
            return False
        return not self.in_place or self.last_stream == "stderr"


#: cursor up a row, to its start, and erase it: a terminal's last line, rewritten
REWRITE_LAST_LINE = "\x1b[1A\r\x1b[2K"


def fits_one_row(line: str) -> bool:
    """Whether ``line`` is on one row of a terminal that ``sys.stdout`` is (never where it
    is a pipe, a file or a capture, whose lines no escape rewrites)."""
    if not sys.stdout.isatty():
        return False
    return len(line) < shutil.get_terminal_size().columns


def updates_in_place() -> bool:
    """Whether the front end replaces a display by its id (a notebook, JupyterLab, a
    capture). IPython's own publisher, a terminal's, prints every update as a new line: a
    status line updated in place printed ``loading the cell`` twice there."""
    shell = get_ipython()
    return shell is None or type(shell.display_pub).publish is not DisplayPublisher.publish


def provenance(
    result: ProgramResult | None, record: RunRecord, status: str | None = None
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "job_id": record.job_id,
        "server": record.server,
        "worker_id": record.worker_id,
        "gpu_ids": list(record.gpu_ids),
        "target": record.target,
        "status": status,
    }
    if record.warning:
        data["warning"] = record.warning
    if record.session_id:
        data["session_id"] = record.session_id
    if result is not None:
        data.update(
            request_id=result.request_id,
            status=result.status,
            timings={
                "queue_ms": result.queue_ms,
                "lease_wait_ms": result.lease_wait_ms,
                "lease_held_ms": result.lease_held_ms,
                "elapsed_ms": result.elapsed_ms,
                "wall_ms": round(record.wall_ms, 3),
            },
        )
    return data


def summary_text(result: ProgramResult, record: RunRecord, facts: ServerFacts) -> str:
    """The finished cell's line, without its status (``StatusLine.show`` says that once)."""
    on_cpu = facts.gpu_count == 0
    where = "ran on CPU" if on_cpu else f"GPU {list(record.gpu_ids) or facts.label}"
    if record.warning:
        where = record.warning
    pieces = []
    if record.session_id:  # the 8 hex digits %kcoral session status shows in full
        pieces.append(f"session {record.session_id[:8]}")
    pieces.append(record.server)
    if result.node:  # the node a router chose (None from a direct server)
        pieces.append(f"node {result.node}")
    if record.worker_id:
        pieces.append(f"worker {record.worker_id}")
    pieces += [where, f"queue {rich.format_ms(result.queue_ms)}"]
    if not on_cpu:  # a CPU server has no GPU lease: its 0.0 ms would say nothing true
        pieces += [
            f"lease wait {rich.format_ms(result.lease_wait_ms)}",
            f"held {rich.format_ms(result.lease_held_ms)}",
        ]
    pieces.append(f"total {rich.format_ms(result.queue_ms + result.elapsed_ms)}")
    if facts.sandbox == "none":  # never a silent downgrade: say when nothing confined it
        pieces.append("no sandbox")
    return " · ".join(pieces)
