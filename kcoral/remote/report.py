"""What a remote function's call shows its caller (CLIENT_API §8, §9): the function's prints,
and a failure's server-side traceback where the user reads it.

``f.remote()`` dropped what the function printed (only ``execute()``'s result held it), so a
``print`` to debug a remote function showed nothing; it is now written to the caller's own
``sys.stdout`` and ``sys.stderr`` when the call ends, as a local call's would be.

``f.remote()`` raising ``RemoteExecutionError`` printed only the local frames (inside
KCoral) and ``runtime: ZeroDivisionError: division by zero``: nothing said which line of the
user's function failed unless they knew to read ``.remote_traceback``, and that named the
uploaded module (``<uploaded:H>``, its own line numbers, the generated dispatcher's frame)
or, in pickle mode, ``<dynamic-code>`` (cloudpickle drops file names). The error gets the
traceback as a note (PEP 678, Python 3.11+), its frames of the user's function pointing at
their file and line; ``str(error)`` and ``.remote_traceback`` stay as they were. A pickle
call that a server without KCoral's trampoline failed, or a JSON call whose return value
JSON cannot carry, gets a note saying so, and what to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import linecache
import re
import signal
import sys
import types
from collections.abc import Callable
from typing import Any, TextIO, TypeAlias

from kcoral.by_value import _sent_by_value as sent_by_value
from kcoral.errors import KCoralError, PrintedOutput, RemoteExecutionError
from kcoral.protocol.dtypes import DTYPES
from kcoral.remote.source import uploaded_line_map
from kcoral.results import ProgramResult
from kcoral.run.terminal_filter import TerminalFilter, is_terminal, utf8_writable

#: The worker's module name for an upload, where it opens an exception's line.
_UPLOADED_MODULE = re.compile(r"^kcoral_uploaded_\d+_\d+\.", re.MULTILINE)
_FRAME = re.compile(r'^  File "(?P<file>[^"\n]*)", line (?P<line>\d+), in (?P<name>.+)$')

#: Where a frame really is: (file, line), or None to drop it (code KCoral generated).
Placer: TypeAlias = Callable[[str, int, str], tuple[str, int] | None]

NOTE_HEADING = "Remote traceback (most recent call last), on the server:"
_PYTHON_HEADING = "Traceback (most recent call last):"
JSON_RETURN = (
    "The function's return value cannot travel in JSON mode: return JSON values (None, bool, "
    "int, finite float, str, list, dict with str keys), bytes or arrays, or use "
    "serialization='pickle'."
)
JSON_DTYPE = (
    "The function's returned array cannot travel in JSON mode: its dtype must be one of "
    f"{', '.join(DTYPES)}; convert it, or use serialization='pickle'."
)
JSON_ITERATOR = (
    "The function returned a generator (or another iterator), which no format carries: it "
    "runs on the server and is gone with the call; return a list of its values (list(...))."
)
UNAWAITED = (
    "The server returned the async def function's coroutine without awaiting it: it does "
    "not run async def functions (no feature 'async-run'); make the function a plain def."
)
OVER_THE_RESPONSE_LIMIT = (
    "{name}() returned more than the server sends in one answer: return less, or raise the "
    "server's limit (kcoral server --max-response-bytes)."
)
NO_TRAMPOLINE = (
    "This server cannot run pickle-mode remote functions (it has no "
    "kcoral_server.worker.trampoline: not a KCoral server, or an older one); call with "
    "serialization='json', or use a KCoral server that lists feature 'serialization'."
)


def interrupted(name: str, caller: Any) -> KeyboardInterrupt:
    """An interrupt (Ctrl-C, a kernel's) of ``name``'s blocking call through ``caller`` (a
    client or a session), as the user reads it. The interrupt closed the call's connection,
    so the server cancels the program; the user read a bare ``KeyboardInterrupt`` under
    forty lines of urllib3 and http.client, nothing about the remote call. What the function
    printed came back with no answer (the server's 499 goes to a closed connection), which
    is said: a user debugging with prints looked for them."""
    server = getattr(caller, "base_url", None) or caller.client.base_url
    return KeyboardInterrupt(
        f"interrupted: the remote call {name}() on {server} was cancelled; "
        "what it printed was not kept"
    )


def ctrl_c_said(cancel: asyncio.CancelledError, name: str, caller: Any) -> BaseException:
    """The cancel of ``name``'s ``run_async`` call through ``caller``: ``interrupted`` where
    ``asyncio.run``'s Ctrl-C cancelled it, as a blocking call's Ctrl-C says it; any other
    cancel (``wait_for``, a task group) as it is."""
    return interrupted(name, caller) if _cancelled_by_ctrl_c() else cancel


def _cancelled_by_ctrl_c() -> bool:
    """Whether the task now being cancelled was cancelled by ``asyncio.run``'s Ctrl-C: its
    runner's SIGINT handler cancels the main task and later raises a bare
    ``KeyboardInterrupt`` of its own, under the ``CancelledError``'s traceback, nothing about
    the remote call. Python 3.11+ (3.10's ``asyncio.run`` raises ``KeyboardInterrupt`` where
    the loop waits, never in the task)."""
    handler = signal.getsignal(signal.SIGINT)
    runner = getattr(getattr(handler, "func", None), "__self__", None)
    runner_type = getattr(asyncio, "Runner", None)
    if runner_type is None or not isinstance(runner, runner_type):
        return False
    return bool(getattr(runner, "_interrupt_count", 0))


_DEADLINE = re.compile(r"(execution timed out after its deadline of (\S+) s) \(.*\)", re.DOTALL)


def call_error_said(error: KCoralError, name: str, caller: Any, timeout: Any) -> Exception:
    """``error`` of ``name``'s call through ``caller`` as its user reads it: a 500
    ``response_too_large`` names the function (it said only "results exceed the configured
    response-size limit"), a 504 ``timeout`` the deadline's setting (``deadline_said``); any
    other error as it is."""
    if error.status_code == 500 and error.kind == "response_too_large":
        return reworded(error, f"{name}(): {error.message}")
    return deadline_said(error, name, caller, timeout)


def deadline_said(error: KCoralError, name: str, caller: Any, timeout: Any) -> Exception:
    """A 504 ``timeout`` of ``name``'s call through ``caller``, whose decorator gave
    ``timeout``, naming that setting as the user wrote it; any other error as it is. The
    server's message named ``timeout_seconds`` and ``--max-timeout-seconds``, which a remote
    function's user never wrote."""
    found = _DEADLINE.fullmatch(error.message) if error.status_code == 504 else None
    if found is None or error.kind != "timeout":
        return error
    decorator = f"@{'session' if hasattr(caller, 'client') else 'client'}.function(timeout=...)"
    if timeout is None:
        setting = f"the server's default, as {name}() sets no timeout; {decorator} sets one"
    elif f"{timeout:g}" != found[2]:  # the server cut it to its most
        setting = f"the server's most; {name}() asked for timeout={timeout:g}"
    else:
        setting = f"{name}()'s timeout={timeout:g}; {decorator} raises it"
    return reworded(error, f"{found[1]} ({setting})")


def reworded(error: KCoralError, message: str) -> KCoralError:
    """``error`` with ``message`` in place of its own, every other attribute kept: a caller
    reads ``retry_after``, ``output``, ``hint`` and ``redirect_to`` of a remote call's error
    as of ``execute()``'s, which a rebuilt error dropped."""
    # not copy.copy: that calls the class with ``args``, which a subclass may not take
    said = type(error).__new__(type(error), error.status_code, message)
    said.__dict__.update(vars(error), message=message)
    return said


def show_output(result: ProgramResult | PrintedOutput) -> None:
    """Write what the call printed where the caller's own prints go, and say when the
    server cut it at the output limit. A call cut by its deadline gives what it printed
    before (``PrintedOutput``), shown before its error as a local call's prints would be."""
    # in the order it wrote them (EXTENSIONS §16), where the server recorded it
    screens: dict[str, TerminalFilter] = {}
    last: dict[str, str] = {}  # each stream's last piece written
    for name, text in result.output_in_order():
        stream = _open_stream(name)
        if stream is None:
            continue
        other = _open_stream("stderr" if name == "stdout" else "stdout")
        if other is not None and other is not stream:
            # its piece before this one, where a terminal shows both; only an ordering
            # courtesy: a stream that cannot flush must not cost the call its result
            with contextlib.suppress(ValueError, OSError):
                other.flush()
        # a lone surrogate failed the write: the call raised instead of returning
        text = utf8_writable(text)
        if is_terminal(stream):
            # a server's escapes must not act on the caller's terminal
            text = screens.setdefault(name, TerminalFilter()).feed(text)
        stream.write(text)
        last[name] = text
    for name in ("stdout", "stderr"):
        stream = _open_stream(name)
        if stream is None:
            continue
        if name in screens:
            # what the function's output left set (colours, a hidden cursor) is undone
            undo = screens[name].restore()
            stream.write(undo)
            last[name] = last.get(name, "") + undo
        if getattr(result, f"{name}_truncated"):
            stream.write(
                ("" if last.get(name, "\n").endswith("\n") else "\n")
                + f"[kcoral: the remote {name} was cut at the output limit; raise it with "
                "@client.function(output_limit_bytes=...)]\n"
            )


def _open_stream(name: str) -> TextIO | None:
    """``sys.stdout`` or ``sys.stderr`` where it can be written: None where there is none
    (pythonw and the like) or the caller closed it (or put a closed file there), whose
    write raised ``ValueError`` out of ``.remote()`` and lost the call's result."""
    stream: TextIO | None = getattr(sys, name)
    if stream is None or getattr(stream, "closed", False):
        return None
    return stream


def show_printed(error: KCoralError) -> None:
    """What a call cut by its deadline printed before it (its 504 says), where a local
    call's prints would be; before the error, as they came before it."""
    if error.output is not None:
        show_output(error.output)


def note_remote_traceback(error: RemoteExecutionError, fn: Callable[..., Any], fmt: str) -> None:
    """Add ``error``'s remote traceback, as the user's code, as a note; never raises."""
    if not hasattr(error, "add_note"):
        return
    if fmt == "pickle" and _no_trampoline(error.result.error or {}):
        # its traceback is of KCoral's import, not of the user's code
        error.add_note(NO_TRAMPOLINE)
        return
    failure = error.result.error or {}
    if _over_the_response_limit(failure):
        # JSON_RETURN's advice (return bytes or arrays, or use pickle) was false for bytes or
        # an array too large to send, in either format
        error.add_note(OVER_THE_RESPONSE_LIMIT.format(name=getattr(fn, "__name__", "the function")))
        return
    if fmt == "json" and (failure.get("kind"), failure.get("instruction_op")) == (
        "serialization",
        "return",
    ):
        # the function returned; its value cannot travel as JSON ("cannot encode value of
        # type 'set'" said neither whose value nor what to do)
        error.add_note(_json_return_note(str(failure.get("message")), fn))
        return
    if fmt == "pickle" and failure.get("kind") == "serialization":
        # the trampoline could not pickle the result, and its message says so and why
        # ("cannot pickle the result (lock): ..."); the note held only KCoral's and
        # cloudpickle's frames
        return
    text = error.remote_traceback
    if not isinstance(text, str) or not text.strip():
        return
    try:
        shown = user_traceback(text, _placer(fn, fmt))
    except Exception:  # a traceback we cannot read: the plain one still helps
        shown = text.rstrip("\n")
    if not any(_FRAME.match(line) for line in shown.split("\n")):
        # no frame of any code (a version mismatch found before the call): the note only
        # repeated the message, under a heading promising a traceback
        return
    # the note is printed wherever the error is (a terminal too): a server's escapes dropped
    if fmt == "json":
        # a class of the function's module is named by the worker's module for the upload
        # ('kcoral_uploaded_23_1.WeirdError'), a name the user never wrote
        shown = _UPLOADED_MODULE.sub("", shown)
    shown = TerminalFilter().feed(_in_cells(shown.removeprefix(_PYTHON_HEADING + "\n")))
    error.add_note(NOTE_HEADING + "\n" + shown)


def _in_cells(text: str) -> str:
    """``text`` with each frame in a notebook cell named as IPython's own tracebacks name it
    (``Cell In[3], line 4``): it named the kernel's file for the cell
    (``/tmp/ipykernel_81/2841.py``), which the user never sees."""
    get_ipython = getattr(sys.modules.get("IPython"), "get_ipython", None)
    shell = get_ipython() if callable(get_ipython) else None
    cell_of = getattr(getattr(shell, "compile", None), "format_code_name", None)
    if not callable(cell_of):  # not in IPython, or one without cell names
        return text
    lines = text.split("\n")
    for index, line in enumerate(lines):
        match = _FRAME.match(line)
        try:
            named = cell_of(match["file"]) if match else None
        except Exception:  # an IPython of another shape: the file name still helps
            named = None
        if match and isinstance(named, tuple) and len(named) == 2:
            lines[index] = f"  {named[0]} {named[1]}, line {match['line']}, in {match['name']}"
    return "\n".join(lines)


def _json_return_note(message: str, fn: Callable[..., Any]) -> str:
    """The note for a JSON-mode return value the worker could not encode (``message``)."""
    if "coroutine" in message and inspect.iscoroutinefunction(fn):
        # A server without EXTENSIONS §3's async-run returns an async def's coroutine unawaited
        return UNAWAITED
    if re.match(r"cannot encode an? (array|tensor) of dtype", message):
        # an array or tensor it did return, of a dtype the wire lacks: "return arrays" misled
        return JSON_DTYPE
    if re.search(r"of type '(generator|async_generator|\w*iterator)'", message):
        # a generator: JSON_RETURN's "or use serialization='pickle'" misled, pickle refuses
        # it too
        return JSON_ITERATOR
    return JSON_RETURN


def _over_the_response_limit(failure: dict[str, Any]) -> bool:
    """The function returned a value (bytes, an array) larger than the server's response
    budget left (PROTOCOL §7.5, EXTENSIONS §10)."""
    message = failure.get("message")
    return (
        failure.get("kind") == "serialization"
        and isinstance(message, str)
        and message.startswith("return would exceed the response size limit")
    )


def _no_trampoline(failure: dict[str, Any]) -> bool:
    """The pickle program's first upload, importing the trampoline, found no KCoral server
    package: a server of the published protocol, or one too old. It said only
    ``runtime: ModuleNotFoundError: No module named 'kcoral_server'``."""
    message = failure.get("message")
    return (
        failure.get("instruction_id") == "module"
        and isinstance(message, str)
        and message.startswith("ModuleNotFoundError: No module named 'kcoral_server")
    )


def user_traceback(text: str, place: Placer) -> str:
    """``text`` (a formatted traceback) with each frame moved where ``place`` says, a frame
    it drops left out with its source lines, and a moved frame lacking its source line given
    the local one."""
    lines = text.rstrip("\n").split("\n")
    shown: list[str] = []
    index = 0
    while index < len(lines):
        match = _FRAME.match(lines[index])
        if match is None:
            shown.append(lines[index])
            index += 1
            continue
        end = index + 1
        while end < len(lines) and lines[end].startswith("    "):
            end += 1
        where = place(match["file"], int(match["line"]), match["name"])
        if where is not None:
            file, line = where
            shown.append(f'  File "{file}", line {line}, in {match["name"]}')
            detail = lines[index + 1 : end]
            if not detail and (file, line) != (match["file"], int(match["line"])):
                local = linecache.getline(file, line).strip()
                detail = [f"    {local}"] if local else []
            shown.extend(detail)
        index = end
    return "\n".join(shown)


def _placer(fn: Callable[..., Any], fmt: str) -> Placer:
    if not isinstance(fn, types.FunctionType):
        return _unchanged
    if fmt == "json":
        return _json_placer(fn)
    return _pickle_placer(fn)


def _unchanged(file: str, line: int, name: str) -> tuple[str, int]:
    return file, line


def _json_placer(fn: types.FunctionType) -> Placer:
    # A JSON-mode program uploads one module, the function's: every <uploaded:...> frame
    # is in it.
    file_line = uploaded_line_map(fn)
    filename = fn.__code__.co_filename

    def place(file: str, line: int, name: str) -> tuple[str, int] | None:
        if not file.startswith("<uploaded:"):
            return file, line
        mapped = file_line(line)
        if mapped is None:
            return None
        return (filename, mapped) if mapped != line else (file, line)

    return place


def _pickle_placer(fn: types.FunctionType) -> Placer:
    # cloudpickle names every code object it sends "<dynamic-code>" but keeps line numbers:
    # a frame of the function, or of a function of its module or of a helper module it uses
    # (sent by value too), is found by name and line.
    namespaces = [fn.__globals__] + [
        vars(value)
        for name, value in fn.__globals__.items()
        if isinstance(value, types.ModuleType) and sent_by_value(value.__name__, value)
    ]
    tops = [fn.__code__] + [
        value.__code__
        for namespace in namespaces
        for value in namespace.values()
        if isinstance(value, types.FunctionType) and value is not fn
    ]
    known = [(code, _last_line(code)) for code in _nested(tops)]

    def place(file: str, line: int, name: str) -> tuple[str, int]:
        if file == "<dynamic-code>":
            for code, last in known:
                if code.co_name == name and code.co_firstlineno <= line <= last:
                    return code.co_filename, line
        return file, line

    return place


def _nested(codes: list[types.CodeType]) -> list[types.CodeType]:
    """``codes`` and the code objects inside them (inner functions, comprehensions)."""
    found: list[types.CodeType] = []
    while codes:
        code = codes.pop()
        found.append(code)
        codes.extend(const for const in code.co_consts if isinstance(const, types.CodeType))
    return found


def _last_line(code: types.CodeType) -> int:
    return max((line for _, _, line in code.co_lines() if line is not None), default=0)
