"""``kcoral run`` results: print the tool's output, save ``--out``, choose the exit status.

CLIENT_API.md §11. ``report`` reads the ``ProgramResult`` of the program that
``kcoral.run.command`` built: the runner's status dict under ``STATUS_KEY`` and, with ``--out``,
the returned folder under ``OUTPUTS_KEY``.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TextIO

from kcoral.run.arguments import PROG, RunOptions
from kcoral.run.progress import Progress, format_bytes
from kcoral.run.terminal_filter import StandardStreams
from kcoral.run.worker_side import OUTPUTS_DIR

if TYPE_CHECKING:
    from kcoral.errors import PrintedOutput
    from kcoral.results import ProgramResult

#: Control characters, C1 included, and the C1 bytes of text that is not UTF-8 (surrogates).
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\udc80-\udc9f]")
STATUS_KEY = "status"
OUTPUTS_KEY = "outputs"
_MAX_SIGNAL = 64
#: PROTOCOL §6.3: a program whose descendants outlived it fails with this ``runtime`` message
_LEFTOVERS = "program left background processes running; they were terminated"
#: PROTOCOL §6.3, SERVER §8: how the message of a program whose worker died starts (a colon
#: and how it ended may follow)
_WORKER_DIED = "worker exited while executing the instruction"


def report(options: RunOptions, result: Any) -> int:
    """Print the captured output, save returned files; returns the exit status."""
    if not options.output_streamed:
        write_in_order(result)
    say_truncated(options, result)
    unfetched = _outputs_unfetched(options, result)
    if not result.completed and unfetched is None:
        error = result.error or {}
        say(_failed_program(error, result.request_id))
        if (error.get("kind"), error.get("message")) == ("runtime", _LEFTOVERS):
            return 1
        traceback = error.get("traceback")
        if isinstance(traceback, str) and traceback:
            write_output(sys.stderr, traceback if traceback.endswith("\n") else traceback + "\n")
        return 1
    outcome = result.results.get(STATUS_KEY)
    if not isinstance(outcome, dict):
        say("invalid response from the server: the runner returned no status")
        return 1
    if outcome.get("error"):
        say(str(outcome["error"]))
        return 1
    skipped_list = outcome.get("skipped") or []
    links = outcome.get("links") or []
    missing = outcome.get("missing") or []
    if not (
        isinstance(skipped_list, list)
        and isinstance(links, list)
        and isinstance(missing, list)
        and all(isinstance(item, Mapping) for item in missing)
    ):
        say("invalid response from the server: the runner's status is malformed")
        return 1
    for skipped in skipped_list:
        say(f"warning: {skipped} is not a regular file or directory; not returned")
    for link in links:
        say(f"warning: {link} is a symbolic link; links are not fetched")
    status = _exit_status(outcome)
    killed_by = _signal_name(outcome.get("signal"))
    if killed_by is not None:
        # a local shell says "Segmentation fault" for such a death; this exit status
        # (128 + N) is kcoral run's own, and the shell said nothing at all
        say(f"the tool was killed by {killed_by}")
    saved = True
    if unfetched is not None:
        say(unfetched)
    elif options.out is not None:
        saved = _save_outputs(options.out, result.results.get(OUTPUTS_KEY))
    for item in missing:
        say(f"missing output {item.get('path')}: {item.get('reason')}")
    if (missing or unfetched or not saved) and status == 0:
        return 1
    # the tool's own status, whatever came back of its outputs: a save that failed here
    # (another run took --out meanwhile) made a tool's 3 read as 1
    return status


#: SERVER §8's failed return of a file over what the answer has left (worker/files.py)
_OVER_THE_ANSWER = re.compile(
    rf"return of '(?:{OUTPUTS_DIR}/)?(.+)' would exceed the response size limit: "
    r"([0-9]+) bytes, ([0-9]+) bytes left \(",
    re.ASCII | re.DOTALL,
)


def _outputs_unfetched(options: RunOptions, result: Any) -> str | None:
    """Why the tool's outputs did not come back, where the tool ran and its status did: the
    outputs' return, the program's last instruction, failed after it (a file over what the
    server's answer has left, one changed as it was read). None otherwise. Such a run read
    "remote program failed (serialization): return of 'outputs/big.bin' would exceed ...",
    exit status 1, whatever the tool's own."""
    if result.completed or options.out is None:
        return None
    error = result.error or {}
    if error.get("instruction_op") != "return":
        return None
    if not isinstance(result.results.get(STATUS_KEY), dict):
        return None
    message = str(error.get("message"))
    over = _OVER_THE_ANSWER.match(message)
    if over is None:
        reason = message.replace(f"'{OUTPUTS_DIR}/", "'")  # paths as --fetch names them
    else:
        path, size, left = over.group(1), int(over.group(2)), int(over.group(3))
        reason = (
            f"{path} is {format_bytes(size)}, more than the {format_bytes(left)} left in "
            "the server's answer (kcoral server --max-response-bytes)"
        )
    return f"the outputs were not fetched: {reason}; nothing was saved to {options.out!r}"


def _failed_program(error: Mapping[str, Any], request_id: object) -> str:
    """The line for a ``FAILED`` program, in the words of the tool the user ran where the
    server's words are the program's (a tool runs inside one)."""
    kind, message = error.get("kind"), error.get("message")
    if (kind, message) == ("runtime", _LEFTOVERS):
        # the tool may have exited 0: "remote program failed (runtime)" blamed it
        # without saying for what, or what to change
        return (
            "the tool left processes running when it ended; they were killed, so the "
            "run failed (a tool must wait for the processes it starts)"
        )
    if kind == "runtime" and isinstance(message, str) and message.startswith(_WORKER_DIED):
        # "worker exited while executing the instruction" spoke of the server's insides; the
        # worker is the tool's parent, which the tool itself can kill (kill $PPID, killpg 0)
        cause = message[len(_WORKER_DIED) :].removeprefix(": ")
        why = f": {cause}" if cause else " (did the tool kill its parent or its process group?)"
        return (
            f"the worker running the tool died mid-run{why}; the tool's exit status is lost "
            f"[request {request_id}]"
        )
    return f"remote program failed ({kind}): {message} [request {request_id}]"


def say_truncated(options: RunOptions, printed: Any) -> None:
    """Which stream of what the tool printed (a result, or what a 504 carried, EXTENSIONS
    §15) the server cut at its output limit, and how to move that limit."""
    if options.merged_output:
        # One capture held both streams (the tool's stderr went to its stdout): "the remote
        # stdout was truncated" hid that its stderr was cut with it.
        if printed.stdout_truncated or printed.stderr_truncated:
            limit = _truncation_limit(options, "")
            say(f"the remote stdout and stderr, captured together, were truncated at {limit}")
    else:
        for stream_name in ("stdout", "stderr"):
            if getattr(printed, f"{stream_name}_truncated"):
                limit = _truncation_limit(options, " per stream")
                say(f"the remote {stream_name} was truncated at {limit}")


def _truncation_limit(options: RunOptions, per: str) -> str:
    """The limit that cut the output and how to move it. The server clamps
    ``--output-limit-bytes`` to its own most, so pointing at the option alone (its default
    is 256 MiB, the server's most 16 MiB) sent the user to raise a limit that was not the one
    that applied. ``per`` follows the option's limit: `` per stream``, or nothing where one
    capture held both streams."""
    asked = options.output_limit_bytes
    most = options.server_output_limit_bytes
    if most is not None and most < asked:
        return (
            f"{format_bytes(most)}, the most this server keeps per stream "
            "(kcoral server --max-output-limit-bytes)"
        )
    return f"{format_bytes(asked)}{per} (--output-limit-bytes)"


def _exit_status(outcome: Mapping[str, Any]) -> int:
    """The tool's exit code; ``128 + N`` for death by signal N (1-64, the signals Linux
    has); a signal out of that range or a code beyond 0-255 is ``1``, never a wrapped 0."""
    number = outcome.get("signal")
    if isinstance(number, int) and not isinstance(number, bool):
        return 128 + number if 1 <= number <= _MAX_SIGNAL else 1
    code = outcome.get("exit_code")
    if isinstance(code, int) and not isinstance(code, bool):
        # statuses beyond 255 cannot be process exit statuses; keep them non-zero
        return code if 0 <= code <= 255 else 1
    return 1


def _signal_name(number: Any) -> str | None:
    """``SIGSEGV (signal 11)`` for a signal number a runner reported, ``signal 40`` for one
    without a name here; None for no signal, or one out of Linux's range."""
    if not isinstance(number, int) or isinstance(number, bool):
        return None
    if not 1 <= number <= _MAX_SIGNAL:
        return None
    try:
        return f"{signal.Signals(number).name} (signal {number})"
    except ValueError:
        return f"signal {number}"


def _save_outputs(out: str, folder: Any) -> bool:
    if folder is None or not hasattr(folder, "save"):
        say("invalid response from the server: the outputs folder is missing")
        return False
    if not folder.files and not folder.directories:
        # every output is missing (said next): an empty --out made the run again, once
        # its --fetch was corrected, fail with "--out ... already exists"
        return True
    total = sum(len(item.read_bytes()) for item in folder.files.values())
    try:
        parent = os.path.dirname(os.path.abspath(out))
        os.makedirs(parent, exist_ok=True)
        with Progress(f"{PROG}: saving outputs", total, sys.stderr) as progress:
            folder.save(out)
            progress.advance(total)
    except (OSError, ValueError) as exc:
        say(f"cannot save the outputs to {out!r}: {exc}")
        return False
    return True


#: which of the tool's output, as printed, ends mid-line (a cut at the output limit, or a
#: tool's last line without its newline): its stderr, and the last output to either stream.
#: ``say`` then starts on a line of its own, where its note read as the end of the tool's
#: line ("err 13kcoral run: the remote stderr ..."); on a terminal that shows both streams
#: the last output counts ("xxxxkcoral run: the remote stdout ...").
_line_open = {"stderr": False, "last": False}


#: the tool's text on a terminal, screened (``terminal_filter``)
_screens = StandardStreams()


def start_on_a_new_line() -> None:
    """Forget an earlier invocation's open line and cut sequences (``kcoral run`` called in
    one process)."""
    _line_open.update(stderr=False, last=False)
    _screens.forget()


def write_in_order(output: ProgramResult | PrintedOutput) -> None:
    """A program's stdout and stderr, each to ours, in the order it wrote them where the
    server recorded it (EXTENSIONS §16); ``write_output`` flushes each before it returns,
    so a terminal showing both sees them in that order."""
    for name, text in output.output_in_order():
        write_output(sys.stdout if name == "stdout" else sys.stderr, text)


def write_output(stream: TextIO, text: str) -> None:
    """The tool's text, as it came to a file or pipe; to a terminal, without the escape
    sequences a malicious server could use on it (``terminal_filter``)."""
    text = _screens.screen("stderr" if stream is sys.stderr else "stdout", stream, text)
    if not text:
        return
    _line_open["last"] = not text.endswith("\n")
    if stream is sys.stderr:
        _line_open["stderr"] = _line_open["last"]
    stream.flush()
    buffer = getattr(stream, "buffer", None)
    if buffer is not None:
        # bytes, so that a non-UTF-8 terminal locale cannot fail on the tool's output
        buffer.write(_as_bytes(text))
        buffer.flush()
    else:
        stream.write(text)
        stream.flush()


#: Lone surrogates that stand for no byte (``surrogateescape`` makes only U+DC80-U+DCFF)
_BYTELESS_SURROGATES = re.compile("[\ud800-\udc7f\udd00-\udfff]")


def _as_bytes(text: str) -> bytes:
    """``text``'s bytes: a surrogate from output that is not UTF-8 as its byte, and one that
    stands for no byte (only a server's JSON can send it, ``"\\ud800"``) as ``\\ud800``,
    where it failed ``kcoral run`` with UnicodeEncodeError."""
    text = _BYTELESS_SURROGATES.sub(lambda found: f"\\u{ord(found.group()):04x}", text)
    return text.encode("utf-8", "surrogateescape")


def _as_escape(found: re.Match[str]) -> str:
    code = ord(found.group())
    return f"\\x{code - 0xDC00 if code >= 0xDC80 else code:02x}"  # a surrogate: its byte


def restore_terminal() -> None:
    """Undo what the tool's output left set on a terminal: colours, a hidden cursor, the
    alternate screen (``TerminalFilter.restore``); before ``kcoral run``'s own lines and
    at its end, so they and the shell's prompt show."""
    _screens.restore()


def say(message: str) -> None:
    """One line of ``kcoral run``'s own on stderr. It quotes what a server sent (an error's
    message, a missing output's path and reason): a control character in it is written as
    ``\\xNN``, so a server can neither break the line nor act on the terminal."""
    message = _CONTROLS.sub(_as_escape, message)
    restore_terminal()  # a tool's hidden cursor or colours must not hide this line
    shared = _same_file(sys.stdout, sys.stderr)
    line_break = "\n" if _line_open["last" if shared else "stderr"] else ""
    _line_open.update(stderr=False, last=False)
    sys.stderr.write(f"{line_break}{PROG}: {message}\n")
    sys.stderr.flush()


def _same_file(first: TextIO, second: TextIO) -> bool:
    """Whether two streams write to one file (a terminal showing both): unknown is no."""
    try:
        one, other = os.fstat(first.fileno()), os.fstat(second.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (one.st_dev, one.st_ino) == (other.st_dev, other.st_ino)
