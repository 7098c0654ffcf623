"""The worker side of ``kcoral run`` (CLIENT_API.md §11), plus the inputs format it reads.

``kcoral run`` uploads this file's source, after ``kcoral.run.worker_tree``'s and
``kcoral.run.worker_outputs``' (the tool's outputs and the report of what did not come
back), as one Python module and runs ``run_tool`` (``kcoral.run.command.runner_source``), so
the three must stay plain: standard library only, nothing done at import time, no import
of ``kcoral`` but of each other (it also runs on servers that only implement PROTOCOL.md).

Small inputs travel as one ``bytes`` upload in a small length-prefixed format: a magic line,
then per file a header (flags, path length, data length), the UTF-8 path and the data. Large
ones are file uploads below ``WORK_DIR`` (read from the local file only while the request is
sent, CLIENT_API §11), ``spec["inputs"]`` naming each and whether it is executable. Only the
executable bit survives (``0700`` or ``0600``; flag 1 in a packed header), which is all the
tools need.
"""

from __future__ import annotations

import errno
import os
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Iterable
from typing import Any

from kcoral.run.worker_outputs import NCU_REPORT, collect_outputs, new_report
from kcoral.run.worker_tree import TreeWriter

INPUTS_MAGIC = b"KCORAL-RUN-INPUTS-1\n"
_HEADER = struct.Struct(">BIQ")
_EXECUTABLE = 1

#: Directory (inside the request workspace) holding the inputs; the tool's working directory.
WORK_DIR = "work"
#: Directory (inside the request workspace) returned as one folder with ``--out``.
OUTPUTS_DIR = "outputs"
#: How long processes the tool leaves behind get to exit on their own once it has ended
#: (multiprocessing's resource tracker and forkserver end when the tool does, moments later)
#: before the worker's leftover check would kill them and fail the run.
LEFTOVER_GRACE_SECONDS = 2.0


def pack_inputs(files: Iterable[tuple[str, bytes, bool]]) -> bytes:
    """Encode ``(relative path, data, executable)`` triples as one inputs blob."""
    chunks = [INPUTS_MAGIC]
    for path, data, executable in files:
        encoded = path.encode("utf-8")
        chunks.append(_HEADER.pack(_EXECUTABLE if executable else 0, len(encoded), len(data)))
        chunks.append(encoded)
        chunks.append(data)
    return b"".join(chunks)


def unpack_inputs(blob: bytes, directory: str) -> list[str]:
    """Write the files of an inputs blob below ``directory``; returns their paths.

    Raises ``ValueError`` for a malformed blob, an unsafe path or a path conflict.
    """
    view = memoryview(blob)
    if bytes(view[: len(INPUTS_MAGIC)]) != INPUTS_MAGIC:
        raise ValueError("inputs: not a kcoral run inputs blob")
    offset = len(INPUTS_MAGIC)
    written = []
    writer = TreeWriter(directory)
    try:
        while offset < len(view):
            if offset + _HEADER.size > len(view):
                raise ValueError("inputs: truncated header")
            flags, path_length, data_length = _HEADER.unpack_from(view, offset)
            offset += _HEADER.size
            end = offset + path_length + data_length
            if end > len(view):
                raise ValueError("inputs: truncated entry")
            path = bytes(view[offset : offset + path_length]).decode("utf-8")
            data = view[offset + path_length : end]
            offset = end
            writer.write(_safe_relative_path(path), data, bool(flags & _EXECUTABLE))
            written.append(path)
    finally:
        writer.close()
    return written


def set_input_modes(work: str, inputs: Iterable[tuple[str, bool]]) -> None:
    """Make each uploaded input ``0700`` (executable) or ``0600``: a file upload has the
    server's mode. The walk is ``TreeWriter``'s, entering only the directories it must
    (a path below ``work`` may pass PATH_MAX) and following no link."""
    writer = TreeWriter(work)
    try:
        # sorted by parts, a directory's files come together: the walk enters it once
        for parts, executable in sorted((_safe_relative_path(path), bit) for path, bit in inputs):
            writer.set_mode(parts, executable)
    finally:
        writer.close()


def _safe_relative_path(path: str) -> list[str]:
    parts = path.split("/")
    if (
        not path
        or path.startswith("/")
        or "\x00" in path
        or any(part in ("", ".", "..") for part in parts)
    ):
        raise ValueError(f"inputs: unsafe path {path!r}")
    return parts


def run_tool(inputs: bytes | None, spec: dict[str, Any]) -> dict[str, Any]:
    """Unpack the inputs, run the tool as a subprocess, collect the requested outputs.

    ``spec`` keys: ``inputs`` (``[path, executable]`` of each uploaded input, optional),
    ``tool``, ``args`` (words after the first ``--``), ``env`` (overrides),
    ``fetch`` (normalized relative paths), ``collect`` (whether outputs come back) and
    ``merge_stderr`` (the tool's stderr goes to its stdout, optional).
    Returns ``exit_code``/``signal`` (one of them set when the tool ran), ``error`` (a
    message when it could not start), ``missing`` (requested outputs not produced),
    ``skipped`` and ``links`` (special files and symlinks: never returned, said apart)
    """
    base = os.getcwd()
    work = os.path.join(base, WORK_DIR)
    outputs = os.path.join(base, OUTPUTS_DIR)
    tool = spec["tool"]
    # the inputs' file uploads made it already, when there were any
    os.makedirs(work, 0o700, exist_ok=True)
    # run-iket creates its output directory itself and refuses an existing one (CLIENT_API
    # §11): it gets a path that does not exist yet, made afterwards if the tool did not.
    if tool != "run-iket":
        os.mkdir(outputs, 0o700)
    try:
        return _run_and_collect(tool, spec, inputs, work, outputs)
    finally:
        os.makedirs(outputs, 0o700, exist_ok=True)  # the folder return needs it


def _run_and_collect(
    tool: str, spec: dict[str, Any], inputs: bytes | None, work: str, outputs: str
) -> dict[str, Any]:
    if inputs:
        unpack_inputs(inputs, work)
    set_input_modes(work, spec.get("inputs") or [])
    args = list(spec["args"])
    env = _tool_environment(tool, spec.get("env") or {}, work)
    report = new_report()
    argv = _tool_argv(tool, args, outputs)
    executable = _resolve_executable(argv[0], work, env["PATH"])
    if executable is None:
        report["error"] = _not_found(argv[0], "PATH" in (spec.get("env") or {}), work)
        return report
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # keep the worker's own buffered output ahead of the tool's
    try:
        # One capture for both streams where the user reads them in one place (a terminal,
        # `2>&1`): the server follows each stream's capture on its own and cannot tell
        # which of two writes came first, so `echo out; echo err >&2; echo out` arrived
        # as out, out, err.
        merged = subprocess.STDOUT if spec.get("merge_stderr") else None
        process = subprocess.Popen(
            argv,
            executable=executable,
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stderr=merged,
        )
    except OSError as exc:
        report["error"] = f"{argv[0]}: {_why_it_cannot_start(executable, exc, work)}"
        return report
    returncode = process.wait()
    _let_leftovers_exit(LEFTOVER_GRACE_SECONDS)
    os.makedirs(outputs, 0o700, exist_ok=True)  # run-iket may have failed before making it
    if returncode < 0:
        report["signal"] = -returncode
    else:
        report["exit_code"] = returncode
    if spec.get("collect"):
        collect_outputs(tool, work, outputs, spec.get("fetch") or [], report)
    return report


def _let_leftovers_exit(grace: float) -> None:
    """Wait up to ``grace`` seconds for the processes the tool left to exit, reaping them.

    The worker is a child subreaper, so what the ended tool left (a ``spawn`` or
    ``forkserver`` pool's resource tracker, which exits when it reads the end of its pipe)
    is now this process's child; the worker's check after the program would count one
    still exiting as a leftover and fail the run. What is still alive after ``grace`` is
    left to that check. Without children (or without the subreaper) it returns at once."""
    deadline = time.monotonic() + grace
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # none left
        if pid:
            continue  # reaped one: look again at once
        if time.monotonic() >= deadline:
            return
        time.sleep(0.01)


def _tool_environment(tool: str, overrides: dict[str, str], work: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(overrides)
    if tool == "ncu":
        env.setdefault("NCU_PROFILE", "1")
    env["KCORAL_DIR"] = work
    # The worker's interpreter comes first even when --env replaced PATH, so 'python' in a
    # script or Makefile is the interpreter the server runs.
    interpreter_dir = os.path.dirname(sys.executable) if sys.executable else ""
    path = env.get("PATH", "")
    if interpreter_dir:
        path = interpreter_dir + (os.pathsep + path if path else "")
    env["PATH"] = path
    return env


def _tool_argv(tool: str, args: list[str], outputs: str) -> list[str]:
    if tool == "python":
        return [sys.executable or "python", *args]
    if tool == "ncu":
        report = os.path.join(outputs, NCU_REPORT)
        return ["ncu", "--config-file", "0", "--export", report, *args]
    if tool == "run-iket":
        return ["run-iket", "--output-dir", outputs, *args]
    if tool == "compute-sanitizer":
        return ["compute-sanitizer", *args]
    if tool == "shell":
        return list(args)
    raise ValueError(f"unknown tool {tool!r}")


def _not_found(name: str, path_set: bool, work: str) -> str:
    """Why the tool's executable was not found, in the user's terms (each read "is not
    installed in the remote server environment"): a path names a file, a relative one among
    the inputs; a bare name is looked up on PATH (which ``--env PATH=...`` may replace),
    never among the inputs, so a sent one is named with the path that runs it."""
    if name.startswith("/"):
        return f"{name}: no such file on the server"
    if "/" in name:
        return (
            f"{name}: no such file among the --send inputs (the tool's directory holds only them)"
        )
    if path_set:
        found = f"{name} is not on the remote PATH that --env PATH set"
    else:
        found = f"{name} is not installed in the remote server environment"
    sent = os.path.isfile(os.path.join(work, name))
    return f"{found}; the sent {name} runs as ./{name}" if sent else found


def _why_it_cannot_start(executable: str, exc: OSError, work: str) -> str:
    """Why a file that is there did not start, as a local shell would say it: a script's
    missing interpreter read ``No such file or directory`` of the script itself, a script
    with Windows line ends the same, and one with no ``#!`` line (which a shell runs with
    sh) ``Exec format error``. A #! interpreter is looked for as the kernel does, from the
    tool's directory ``work``: one that is there failed to start itself."""
    reason = exc.strerror or str(exc)
    try:
        with open(executable, "rb") as file:
            head = file.read(256)
    except OSError:
        return reason
    if exc.errno == errno.ENOENT and head.startswith(b"#!"):
        # the kernel splits the line at a space or tab only, so a "\r" ends the name
        line = head[2:].split(b"\n", 1)[0].lstrip(b" \t")
        name = line.split(b" ", 1)[0].split(b"\t", 1)[0]
        interpreter = name.decode("utf-8", "backslashreplace")
        if interpreter.endswith("\r"):
            return (
                f"its #! line ends in a carriage return (Windows line ends), so it names "
                f"{interpreter!r}, which is not there: convert the file to Unix line ends"
            )
        if os.path.exists(os.path.join(work, interpreter)):
            # a script as interpreter whose own #! interpreter is missing, or a program
            # whose loader is: the same ENOENT, but "not on the server" would be untrue
            return (
                f"its interpreter {interpreter!r} (its #! line) is on the server but cannot "
                "start: run it alone to see why"
            )
        return f"its interpreter {interpreter!r} (its #! line) is not on the server"
    if head.startswith(b"\x7fELF"):
        if exc.errno == errno.ENOENT:  # the file is there: its ELF interpreter is not
            return f"{reason}: the loader it was linked for is not on the server"
        if exc.errno == errno.ENOEXEC:
            return f"{reason}: a program this server cannot run (built for another machine?)"
        return reason
    if exc.errno == errno.ENOEXEC and not head.startswith(b"#!"):
        return f"{reason}: it has no #! line, so it cannot run directly; add one (#!/bin/sh)"
    return reason


def _resolve_executable(name: str, work: str, path: str) -> str | None:
    if "/" in name:
        candidate = os.path.join(work, name)  # an absolute name stays absolute
        return candidate if os.path.isfile(candidate) else None
    return shutil.which(name, path=path)
