"""JSON-lines event log with a console mirror (SERVER.md §13).

One run directory per server start, ``<log-dir>/runs/<YYYYMMDDTHHMMSS.ffffffZ>[-N]/`` holding
``events.jsonl``, ``programs/`` and ``output/``. ``events.jsonl`` is opened once and flushed
per line; ``emit`` sits on the request path, so it only formats and writes.

Logging never fails the server: every I/O or encoding error is swallowed (and counted).

Who fills it: any client-token holder decides which programs land in ``programs/``, so that
folder is held under ``--log-programs-max-bytes`` (``program_records``), the oldest first out.

Who could read it otherwise: other local users. Records name clients and requests, programs
hold uploaded source, capture files hold output; so every directory made here is 0700 and
every file 0600 (SERVER §13); an existing ``runs/`` that others could read is tightened to
0700 with a WARNING event (``log_dir_permissions``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from kcoral_server.storage import old_runs
from kcoral_server.storage.program_records import DEFAULT_LIMIT, ProgramRecords
from kcoral_server.storage.workspace import OUTPUT_PREFIX, instance_prefix

LEVELS = ("INFO", "WARNING", "ERROR")
# Omitted from the console mirror (SERVER.md §13); they stay in events.jsonl.
BULKY_FIELDS = frozenset({"config", "traceback", "versions", "ops", "uploads"})
CONSOLE_VALUE_LIMIT = 120
#: Control characters but tab (C0, DEL, C1): a terminal acts on them (ESC moves the cursor,
#: erases lines, sets the title; C1 CSI does the same in 8-bit terminals) and journald
#: stores a line holding them as a blob, so a program's message could erase or hide lines.
_CONSOLE_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
UNENCODABLE_LIMIT = 2000
ROTATED_EVENTS_NAME = "events.1.jsonl"  # events.jsonl's previous half (``log_events_max_bytes``)
ROTATED_EVENT = "events_log_rotated"  # the first record of each new events.jsonl
ROTATING_EVENTS_NAME = ".events.jsonl.new"  # the next events.jsonl, until it is renamed


# (whole second, its formatted form): one strftime per second. Read and replaced as one
# tuple, so threads never mix two seconds.
_last_second: tuple[int, str] = (-1, "")


def format_timestamp(seconds: float) -> str:
    """UTC ISO-8601 with millisecond precision and ``Z``: ``2024-05-01T09:30:00.123Z``."""
    global _last_second
    millis = int(seconds * 1000)
    whole, ms = divmod(millis, 1000)
    cached = _last_second
    if cached[0] != whole:
        cached = (whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)))
        _last_second = cached
    return f"{cached[1]}.{ms:03d}Z"


def run_dir_name(seconds: float) -> str:
    """``YYYYMMDDTHHMMSS.ffffffZ`` (UTC, microseconds)."""
    micros = int(seconds * 1_000_000)
    whole, us = divmod(micros, 1_000_000)
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(whole)) + f".{us:06d}Z"


def encode_record(timestamp: str, level: str, event: str, fields: dict[str, Any]) -> bytes:
    """One compact JSON line (with ``\\n``). Values JSON cannot hold are written as ``repr``;
    a record that still cannot be encoded keeps only its header and ``unencodable_fields``."""
    record: dict[str, Any] = {"timestamp": timestamp, "level": level, "event": event}
    for key, value in fields.items():
        record.setdefault(key, value)
    try:
        text = json.dumps(
            record, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=repr
        )
        try:
            return text.encode("utf-8") + b"\n"
        except UnicodeEncodeError:  # lone surrogates: escape them instead
            return _dumps_ascii(record) + b"\n"
    except Exception:
        try:
            described = repr(fields)
        except Exception as exc:
            described = f"<repr failed: {exc.__class__.__name__}>"
        fallback = {
            "timestamp": timestamp,
            "level": level,
            "event": event,
            "unencodable_fields": described[:UNENCODABLE_LIMIT],
        }
        return _dumps_ascii(fallback) + b"\n"


def _dumps_ascii(record: dict[str, Any]) -> bytes:
    return json.dumps(
        record, separators=(",", ":"), ensure_ascii=True, allow_nan=False, default=repr
    ).encode("ascii")


def format_console_value(value: Any) -> str:
    """Console form of a field: floats with one decimal, JSON for containers, cut at 120."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, float):
        text = f"{value:.1f}" if math.isfinite(value) else repr(value)
    elif isinstance(value, (int, str)):
        text = str(value)
    else:
        try:
            text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=repr)
        except Exception:
            text = repr(value)
    # One event per console line, whatever the message holds, and no line a value can
    # rewrite on the operator's terminal: control characters are shown, never sent.
    text = escape_controls(text.replace("\r", "\\r").replace("\n", "\\n"))
    if len(text) > CONSOLE_VALUE_LIMIT:
        text = text[:CONSOLE_VALUE_LIMIT] + "..."
    return text


def escape_controls(text: str) -> str:
    """``text`` with its control characters but tab (``_CONSOLE_CONTROLS``) written ``\\xNN``:
    what a caller or a program chose may reach the console, never act on its terminal."""
    return _CONSOLE_CONTROLS.sub(lambda found: f"\\x{ord(found.group()):02x}", text)


def format_console_line(timestamp: str, level: str, event: str, fields: dict[str, Any]) -> str:
    """``<timestamp> <LEVEL padded to 7> <event> k=v ...`` without null and bulky fields."""
    parts = [f"{timestamp} {level:<7} {event}"]
    for key, value in fields.items():
        if value is None or key in BULKY_FIELDS:
            continue
        parts.append(f"{key}={format_console_value(value)}")
    return " ".join(parts)


def _tighten(runs: Path) -> dict[str, Any] | None:
    """Make an existing ``runs/`` owner-only: it is KCoral's and holds only runs, which
    older versions left readable (0755). Returns the fields of a WARNING when it was
    readable by others (tightened, or left so when that failed), else None."""
    try:
        mode = stat.S_IMODE(os.stat(runs).st_mode)
    except OSError:
        return None
    if not mode & 0o077:
        return None
    fields: dict[str, Any] = {"path": str(runs), "mode": f"{mode:04o}"}
    try:
        os.chmod(runs, mode & 0o700)
    except OSError as exc:
        fields["message"] = f"other users can read earlier runs here; cannot tighten: {exc}"
    else:
        fields["message"] = "other users could read earlier runs here; made it 0700"
    return fields


Listener = Callable[[str, dict[str, Any]], None]


class Listeners:
    """Who hears every record of a log (``/metrics`` counts from them), on the emitting
    thread; what one raises is swallowed and counted, so it never fails the emitter. The
    server's ``EventLog`` and the router's ``RouterLog`` both dispatch through one."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []

    def add(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def tell(self, event: str, fields: dict[str, Any]) -> int:
        """Call every listener with ``(event, fields)``; how many raised."""
        failed = 0
        for listener in self._listeners:
            try:
                listener(event, fields)
            except Exception:
                failed += 1
        return failed


class EventLog:
    """The server's event log. ``log_dir=None`` writes no files (console only, if enabled).

    Programs are stored under ``log_programs_max_bytes`` (``ProgramRecords``; 0 stores none).

    ``stream`` defaults to the current ``sys.stderr`` at each write.
    """

    def __init__(
        self,
        log_dir: Path | None,
        *,
        console: bool,
        log_programs: bool,
        log_programs_max_bytes: int = DEFAULT_LIMIT,
        log_events_max_bytes: int = DEFAULT_LIMIT,
        stream: TextIO | None = None,
    ) -> None:
        self.console = console
        # events.jsonl is renamed events.1.jsonl at half the bound (0: never), so the two
        # files together stay within it (give or take one line).
        self._rotate_at = max(1, log_events_max_bytes // 2) if log_events_max_bytes > 0 else 0
        self._written = 0  # bytes in the current events.jsonl
        self.log_programs = log_programs
        self.errors = 0  # logging failures swallowed so far
        self.file_error: str | None = None  # why file logging is off despite a log_dir
        self._stream = stream
        self._lock = threading.Lock()
        # Called with every record (``/metrics`` counts from them): see ``add_listener``.
        self._listeners = Listeners()
        self._file: BinaryIO | None = None
        self._run_dir: Path | None = None
        self._run_hold: int | None = None  # the run folder's lock: in use (``old_runs``)
        self._temp_output: Path | None = None
        self._output_dir: Path | None = None
        if log_dir is not None:
            try:
                self._open_run(Path(log_dir))
            except OSError as exc:
                self.file_error = f"cannot create the log run directory: {exc}"
                self._run_dir = None
                self._file = None
                self._write_console(
                    format_console_line(
                        format_timestamp(time.time()),
                        "WARNING",
                        "event_log_disabled",
                        {"error": self.file_error},
                    )
                )
        # ``--log-programs-max-bytes 0`` stores no program, like ``--no-log-programs``.
        self._programs: ProgramRecords | None = None
        if self._run_dir is not None and log_programs and log_programs_max_bytes > 0:
            self._programs = ProgramRecords(
                self._run_dir / "programs",
                log_programs_max_bytes,
                report=self._programs_trimmed,
                failed=self._count_error,
            )

    def _open_run(self, log_dir: Path) -> None:
        log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        runs = log_dir / "runs"
        runs.mkdir(mode=0o700, exist_ok=True)
        loose = _tighten(runs)
        name = run_dir_name(time.time())
        suffix = 0
        while True:
            candidate = runs / (name if suffix == 0 else f"{name}-{suffix}")
            try:
                candidate.mkdir(mode=0o700)
                break
            except FileExistsError:
                suffix += 1
        self._run_hold = old_runs.hold(candidate)
        (candidate / "programs").mkdir(mode=0o700)
        (candidate / "output").mkdir(mode=0o700)
        # Opened once for the whole run: emit() must not pay an open() per record.
        fd = os.open(
            candidate / "events.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600
        )
        self._file = os.fdopen(fd, "ab")
        self._run_dir = candidate
        self._output_dir = candidate / "output"
        if loose is not None:
            self.emit("log_dir_permissions", "WARNING", **loose)

    def remove_old_runs(self, keep: int) -> None:
        """Remove the earlier run folders beside this one past the newest ``keep`` that no
        server holds (``--log-runs-max``; 0 keeps all): one ``log_runs_removed`` event when
        any was removed or could not be. Blocking (a run may hold many files): the server
        calls it off its event loop."""
        if self._run_dir is None or keep <= 0:
            return
        try:
            outcome = old_runs.remove_old_runs(self._run_dir.parent, keep)
        except Exception as exc:  # logging never fails the server (nor its start)
            self.emit("log_runs_removed", "WARNING", removed=0, kept=keep, error=repr(exc))
            return
        if outcome.removed or outcome.failed:
            self.emit(
                "log_runs_removed",
                "WARNING" if outcome.failed else "INFO",
                removed=len(outcome.removed),
                kept=keep,
                in_use=len(outcome.in_use),
                failed=outcome.failed or None,
            )

    @property
    def run_dir(self) -> Path | None:
        """This run's directory, or None without file logging."""
        return self._run_dir

    @property
    def events_path(self) -> Path | None:
        return None if self._run_dir is None else self._run_dir / "events.jsonl"

    @property
    def output_dir(self) -> Path:
        """Where capture files go: ``<run_dir>/output``, else a private temporary directory."""
        if self._output_dir is None:
            with self._lock:
                if self._output_dir is None:
                    # named by the instance: a server killed with SIGKILL leaves it to the
                    # next one to start (storage.workspace)
                    prefix = instance_prefix(OUTPUT_PREFIX)
                    self._temp_output = Path(tempfile.mkdtemp(prefix=prefix))
                    self._output_dir = self._temp_output
        return self._output_dir

    def add_listener(self, listener: Listener) -> None:
        """Have ``listener(event, fields)`` called with every record, written or not (even
        with ``--log-dir ''``), on the emitting thread; what it raises is swallowed."""
        self._listeners.add(listener)

    def emit(self, event: str, level: str = "INFO", **fields: Any) -> None:
        """Write one record (and its console line). Never raises."""
        self.errors += self._listeners.tell(event, fields)
        if self._file is None and not self.console:
            return  # nothing to write to (``--log-dir ''`` without console): skip formatting
        try:
            timestamp = format_timestamp(time.time())
            if self._file is not None:
                line = encode_record(timestamp, level, event, fields)
                with self._lock:
                    rotated = self._rotated_for(len(line))
                    if rotated is not None:  # the new file's first record says where the rest went
                        line = encode_record(timestamp, "INFO", ROTATED_EVENT, rotated) + line
                    file = self._file
                    if file is not None:
                        file.write(line)
                        file.flush()
                        self._written += len(line)
                if rotated is not None:
                    self.errors += self._listeners.tell(ROTATED_EVENT, rotated)
                    if self.console:
                        self._write_console(
                            format_console_line(timestamp, "INFO", ROTATED_EVENT, rotated)
                        )
            if self.console:
                self._write_console(format_console_line(timestamp, level, event, fields))
        except Exception:
            self.errors += 1

    def _rotated_for(self, size: int) -> dict[str, Any] | None:
        """Rotate before a record of ``size`` bytes that would take ``events.jsonl`` past
        half the bound (under the lock); the ``events_log_rotated`` fields when it did. An
        empty file is never rotated: it would replace the last half with nothing."""
        full = self._written + size > self._rotate_at
        if self._file is None or not (self._rotate_at and self._written and full):
            return None
        if not self._rotate():
            return None
        return {"previous": ROTATED_EVENTS_NAME, "limit": 2 * self._rotate_at}

    def _rotate(self) -> bool:
        """events.jsonl becomes events.1.jsonl and a new one is opened (under the lock).

        On failure the current file stays and is written on (never a lost record), and
        rotation is tried again only after another half bound."""
        assert self._run_dir is not None and self._file is not None
        current = self._run_dir / "events.jsonl"
        rotating = self._run_dir / ROTATING_EVENTS_NAME
        rotated = self._run_dir / ROTATED_EVENTS_NAME
        fd = -1
        moved = False
        try:
            fd = os.open(
                rotating, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o600
            )
            os.replace(current, rotated)
            moved = True
            os.replace(rotating, current)
        except OSError:
            self.errors += 1
            self._written = 0
            with contextlib.suppress(OSError):
                if moved:  # the file written on stays events.jsonl
                    os.replace(rotated, current)
                if fd >= 0:
                    os.close(fd)
                    os.unlink(rotating)
            return False
        with contextlib.suppress(OSError):
            self._file.close()
        self._file = os.fdopen(fd, "ab")
        self._written = 0
        return True

    def _write_console(self, line: str) -> None:
        try:
            stream = self._stream if self._stream is not None else sys.stderr
            stream.write(line + "\n")
            stream.flush()
        except Exception:
            self.errors += 1

    def record_program(self, request_id: str, program_bytes: bytes | memoryview) -> str | None:
        """Store ``programs/<request-id>.json`` under ``--log-programs-max-bytes`` (the
        oldest go first); returns its file name, or None if not stored."""
        programs = self._programs
        if programs is None:
            return None
        # Request ids are canonical UUIDs (PROTOCOL §8); refuse anything that could escape.
        if not request_id or not all(
            (c.isascii() and c.isalnum()) or c in "-_." for c in request_id
        ):
            return None
        if request_id.startswith("."):
            return None
        return programs.store(request_id, program_bytes)

    def _programs_trimmed(self, fields: dict[str, Any]) -> None:
        self.emit("programs_log_trimmed", "WARNING", **fields)

    def _count_error(self) -> None:
        self.errors += 1

    def close(self) -> None:
        """Close ``events.jsonl`` and remove a temporary output directory. Idempotent."""
        # Trimming counted since the last (rate-limited) report is not lost at shutdown.
        pending = self._programs.take_pending_report() if self._programs is not None else None
        if pending is not None:
            self._programs_trimmed(pending)
        with self._lock:
            file, self._file = self._file, None
            temp, self._temp_output = self._temp_output, None
            hold, self._run_hold = self._run_hold, None
        if file is not None:
            with contextlib.suppress(OSError):
                file.close()
        if hold is not None:
            os.close(hold)  # the run folder is no longer in use: a later start may remove it
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
