"""The worker side of ``kcoral run`` (CLIENT_API.md §11), plus the inputs format it reads.

``kcoral run`` uploads this file's source as a Python module and runs ``run_tool``, so the
module must stay plain: standard library only, nothing done at import time, no import of
``kcoral`` (it also runs on servers that only implement PROTOCOL.md).

Small inputs travel as one ``bytes`` upload in a small length-prefixed format: a magic line,
then per file a header (flags, path length, data length), the UTF-8 path and the data. Large
ones are file uploads below ``WORK_DIR`` (read from the local file only while the request is
sent, CLIENT_API §11), ``spec["inputs"]`` naming each and whether it is executable. Only the
executable bit survives (``0700`` or ``0600``; flag 1 in a packed header), which is all the
tools need.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

INPUTS_MAGIC = b"KCORAL-RUN-INPUTS-1\n"
_HEADER = struct.Struct(">BIQ")
_EXECUTABLE = 1

#: Directory (inside the request workspace) holding the inputs; the tool's working directory.
WORK_DIR = "work"
#: Directory (inside the request workspace) returned as one folder with ``--out``.
OUTPUTS_DIR = "outputs"
NCU_REPORT = "capture.ncu-rep"
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
    writer = _TreeWriter(directory)
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
    server's mode. The walk is ``_TreeWriter``'s, entering only the directories it must
    (a path below ``work`` may pass PATH_MAX) and following no link."""
    writer = _TreeWriter(work)
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


_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _TreeWriter:
    """Writes files below one directory relative to directory descriptors. Absolute paths
    passed PATH_MAX for a tree the protocol allows (4096 bytes below the work directory,
    which has its own path) and failed with 'File name too long'. Only the directory
    written into is open, as a tree may be deeper than the open-files limit; a move opens
    only where the next file's parents differ, climbing through '..' (nothing else writes
    there meanwhile: inputs go in before the tool starts, outputs are copied once it ended)."""

    def __init__(self, directory: str, what: str = "inputs") -> None:
        self._fd = os.open(directory, _DIRECTORY_FLAGS)
        self._names: list[str] = []  # the open directory's path below ``directory``
        self._what = what  # how a conflict is named

    def close(self) -> None:
        os.close(self._fd)

    def write(self, parts: list[str], data: memoryview, executable: bool) -> None:
        self._move_to(parts[:-1], parts)
        mode = 0o700 if executable else 0o600
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(parts[-1], flags, mode, dir_fd=self._fd)
        except FileExistsError:
            raise ValueError(f"{self._what}: path conflict at {'/'.join(parts)!r}") from None
        # Plain writes, not a file object: os.fdopen added an fstat, an ioctl and two
        # lseeks to each file, a third of the calls of a --send of many small files.
        try:
            while data:
                data = data[os.write(fd, data) :]
            os.fchmod(fd, mode)  # the umask must not strip the executable bit
        finally:
            os.close(fd)

    def make_directory(self, parts: list[str]) -> None:
        self._move_to(parts, parts)

    def set_mode(self, parts: list[str], executable: bool) -> None:
        """Give the existing file ``parts`` the mode ``write`` gives; nothing is created."""
        self._move_to(parts[:-1], parts, create=False)
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._fd)
        try:
            os.fchmod(fd, 0o700 if executable else 0o600)
        finally:
            os.close(fd)

    def copy_file(self, parts: list[str], source_fd: int) -> None:
        """Copy the open file ``source_fd`` (left open) to ``parts``, replacing a file."""
        self._move_to(parts[:-1], parts)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        with (
            os.fdopen(os.open(parts[-1], flags, 0o600, dir_fd=self._fd), "wb") as target,
            os.fdopen(source_fd, "rb", closefd=False) as source,
        ):
            shutil.copyfileobj(source, target)

    def _move_to(self, parents: list[str], parts: list[str], create: bool = True) -> None:
        shared = 0
        while shared < min(len(parents), len(self._names)):
            if parents[shared] != self._names[shared]:
                break
            shared += 1
        while len(self._names) > shared:
            self._enter(os.open("..", _DIRECTORY_FLAGS, dir_fd=self._fd))
            self._names.pop()
        for name in parents[shared:]:
            if create:
                self._make_here(name, parts)
            self._enter(os.open(name, _DIRECTORY_FLAGS, dir_fd=self._fd))
            self._names.append(name)

    def _make_here(self, name: str, parts: list[str]) -> None:
        try:
            os.mkdir(name, 0o700, dir_fd=self._fd)
        except FileExistsError:
            # only directories this writer made can exist here; anything else conflicts
            mode = os.stat(name, dir_fd=self._fd, follow_symlinks=False).st_mode
            if not stat.S_ISDIR(mode):
                raise ValueError(f"{self._what}: path conflict at {'/'.join(parts)!r}") from None

    def _enter(self, fd: int) -> None:
        os.close(self._fd)
        self._fd = fd


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
    report: dict[str, Any] = dict.fromkeys(("exit_code", "signal", "error"))
    report.update(missing=[], skipped=[], links=[])
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
        report["error"] = f"{argv[0]}: {exc.strerror or exc}"
        return report
    returncode = process.wait()
    _let_leftovers_exit(LEFTOVER_GRACE_SECONDS)
    os.makedirs(outputs, 0o700, exist_ok=True)  # run-iket may have failed before making it
    if returncode < 0:
        report["signal"] = -returncode
    else:
        report["exit_code"] = returncode
    if spec.get("collect"):
        for path in outermost_paths(spec.get("fetch") or []):
            problem = _fetch(work, outputs, path, report)
            if problem:
                report["missing"].append({"path": path, "reason": problem})
        _drop_untransferable(outputs, report)
        if tool == "ncu" and not os.path.isfile(os.path.join(outputs, NCU_REPORT)):
            report["missing"].append({"path": NCU_REPORT, "reason": "ncu wrote no report"})
        if tool == "run-iket" and not _has_files(outputs):
            report["missing"].append({"path": ".", "reason": "run-iket wrote no file"})
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


def outermost_paths(paths: Iterable[str]) -> list[str]:
    """Sorted, duplicate-free normalized paths without those inside another listed path."""
    kept: list[str] = []
    for path in sorted(set(paths)):
        if not any(path.startswith(parent + "/") for parent in kept):
            kept.append(path)
    return kept


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


def _resolve_executable(name: str, work: str, path: str) -> str | None:
    if "/" in name:
        candidate = os.path.join(work, name)  # an absolute name stays absolute
        return candidate if os.path.isfile(candidate) else None
    return shutil.which(name, path=path)


def _fetch(work: str, outputs: str, path: str, report: dict[str, Any]) -> str | None:
    """Copy ``work/path`` to ``outputs/path``; returns why it could not, or ``None``.

    Relative to directory descriptors, like the inputs: a tree the tool made below the work
    directory may be deeper than PATH_MAX allows from '/' ('File name too long'). An entry
    below a fetched directory that cannot be read (a tool's ``chmod 000``) is a missing
    output of its own and the rest is copied: one stopped the whole copy, losing the
    entries sorted after it."""
    parts = path.split("/")
    parent = os.open(work, _DIRECTORY_FLAGS)
    writer: _TreeWriter | None = None
    try:
        for name in parts[:-1]:  # a symlinked parent is followed, as a path would be
            parent = _enter_from(parent, os.open(name, _FOLLOWING_FLAGS, dir_fd=parent))
        info = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
        if stat.S_ISLNK(info.st_mode):
            return "is a symbolic link (links are not fetched)"
        if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
            return "is not a regular file or directory"
        writer = _TreeWriter(outputs, "outputs")
        opened = os.open(parts[-1], _FILE_FLAGS, dir_fd=parent)
        try:
            if stat.S_ISREG(info.st_mode):
                writer.copy_file(parts, opened)
            else:
                writer.make_directory(parts)
                _copy_tree(opened, parts, writer, report)
        finally:
            os.close(opened)
    except FileNotFoundError:
        return "not found"
    except OSError as exc:
        return exc.strerror or str(exc)
    except ValueError as exc:
        return str(exc)
    finally:
        if writer is not None:
            writer.close()
        os.close(parent)
    return None


_FOLLOWING_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _enter_from(old: int, new: int) -> int:
    os.close(old)
    return new


def _copy_tree(source: int, parts: list[str], writer: _TreeWriter, report: dict[str, Any]) -> None:
    """Copy regular files and directories (empty ones too); other entries are skipped, and
    unreadable ones are missing outputs."""
    missing = report["missing"]

    def unreadable(_parent: int, below: list[str], exc: OSError) -> None:
        missing.append(_unreadable([*parts, *below], exc))

    for directory, below, info in _entries(source, unreadable):
        if stat.S_ISDIR(info.st_mode):
            writer.make_directory([*parts, *below])
        elif stat.S_ISREG(info.st_mode):
            try:
                fd = os.open(below[-1], _FILE_FLAGS, dir_fd=directory)
            except OSError as exc:
                missing.append(_unreadable([*parts, *below], exc))
                continue
            try:
                writer.copy_file([*parts, *below], fd)
            finally:
                os.close(fd)
        else:
            report[_said_as(info.st_mode)].append(_reported([*parts, *below]))


def _unreadable(parts: list[str], exc: OSError) -> dict[str, str]:
    return {"path": _reported(parts), "reason": exc.strerror or str(exc)}


def _reported(parts: list[str]) -> str:
    """A path for the runner's status, which travels as JSON text: a name that is not UTF-8
    (``listdir`` gives its bytes as surrogates) is shown with those bytes escaped."""
    path = "/".join(parts)
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return repr(os.fsencode(path))[2:-1]
    return path


def _name_problem(name: str) -> str | None:
    """Why a folder return cannot carry an entry named ``name`` (PROTOCOL §5.5), or None."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "its name is not valid UTF-8"
    if "\\" in name:
        return "its name holds a backslash"
    return None


def _entries(
    top: int,
    unreadable: Callable[[int, list[str], OSError], None],
    descend: Callable[[str], bool] = lambda name: True,
) -> Iterator[tuple[int, list[str], os.stat_result]]:
    """Each entry below the open directory ``top`` (symlinks not followed), a directory
    before what it holds: the open directory holding it (valid until the next entry), its
    path parts below ``top`` and its ``lstat``. Only the directory listed is open (a tree
    may be deeper than the open-files limit); the walk climbs back through '..', which
    must be the directory listed before (iterative: no recursion limit either).

    A directory that cannot be opened or listed is not yielded: ``unreadable`` gets the
    open directory holding it, its parts and the error (a tool's ``chmod 000`` directory
    raised a traceback or stopped the copy). A directory whose name ``descend`` refuses is
    yielded and not entered."""
    current = os.dup(top)
    try:
        info = os.fstat(current)
        listing = sorted(os.listdir(current), reverse=True)
        stack: list[tuple[tuple[int, int], list[str], list[str]]] = [
            ((info.st_dev, info.st_ino), [], listing)
        ]
        while stack:
            _identity, parts, names = stack[-1]
            if not names:
                stack.pop()
                if stack:
                    up = os.open("..", _DIRECTORY_FLAGS, dir_fd=current)
                    current = _enter_from(current, up)
                    info = os.fstat(current)
                    if (info.st_dev, info.st_ino) != stack[-1][0]:
                        raise OSError(errno.ESTALE, "a directory moved while it was copied")
                continue
            name = names.pop()
            entry = os.stat(name, dir_fd=current, follow_symlinks=False)
            if not stat.S_ISDIR(entry.st_mode) or not descend(name):
                yield current, [*parts, name], entry
                continue
            try:
                child = os.open(name, _DIRECTORY_FLAGS, dir_fd=current)
            except OSError as exc:
                unreadable(current, [*parts, name], exc)
                continue
            try:
                info = os.fstat(child)
                listing = sorted(os.listdir(child), reverse=True)
            except OSError as exc:
                os.close(child)
                unreadable(current, [*parts, name], exc)
                continue
            yield current, [*parts, name], entry
            current = _enter_from(current, child)
            stack.append(((info.st_dev, info.st_ino), [*parts, name], listing))
    finally:
        os.close(current)


def _drop_untransferable(outputs: str, report: dict[str, Any]) -> None:
    """Remove symlinks and special files a tool left in ``outputs`` (a folder return refuses
    them and would fail the whole program), naming them in ``report``. What the return
    cannot carry for other reasons goes to ``missing``: a file or an empty directory it
    cannot read is removed (run-iket's own outputs, made there by the tool; a directory
    that cannot be read and holds entries stays, and the folder return fails naming it),
    and an entry whose name the return cannot hold (not UTF-8, a backslash) is moved out
    of ``outputs`` (one such name failed the run and lost every other output)."""
    missing = report["missing"]

    def unreadable(parent: int, parts: list[str], exc: OSError) -> None:
        with contextlib.suppress(OSError):  # not empty: the folder return names it
            os.rmdir(parts[-1], dir_fd=parent)
            missing.append(_unreadable(parts, exc))

    top = os.open(outputs, _DIRECTORY_FLAGS)
    above = os.open(os.path.dirname(outputs), _DIRECTORY_FLAGS)
    try:
        for directory, parts, info in _entries(top, unreadable, _travels):
            problem = _name_problem(parts[-1])
            if problem is not None:
                if _moved_away(directory, parts[-1], above, len(missing)):
                    missing.append({"path": _reported(parts), "reason": f"{problem}; not returned"})
            elif stat.S_ISREG(info.st_mode):
                try:
                    os.close(os.open(parts[-1], _FILE_FLAGS, dir_fd=directory))
                except OSError as exc:
                    os.unlink(parts[-1], dir_fd=directory)
                    missing.append(_unreadable(parts, exc))
            elif not stat.S_ISDIR(info.st_mode):
                os.unlink(parts[-1], dir_fd=directory)
                report[_said_as(info.st_mode)].append(_reported(parts))
    finally:
        os.close(above)
        os.close(top)


def _moved_away(directory: int, name: str, above: int, number: int) -> bool:
    """Move the entry ``name`` out of the outputs into ``above``: renamed, not removed, one
    call whatever the tree below it holds. A directory without write permission cannot
    change parents; an empty one is removed instead. False where neither works: the
    folder return then fails naming it."""
    try:
        os.rename(
            name,
            f".kcoral-run-dropped-{os.getpid()}-{number}",
            src_dir_fd=directory,
            dst_dir_fd=above,
        )
    except OSError:
        try:
            os.rmdir(name, dir_fd=directory)
        except OSError:
            return False
    return True


def _travels(name: str) -> bool:
    return _name_problem(name) is None


def _said_as(mode: int) -> str:
    return "links" if stat.S_ISLNK(mode) else "skipped"  # not "not a regular file" alone


def _has_files(directory: str) -> bool:
    top = os.open(directory, _DIRECTORY_FLAGS)
    try:
        return any(
            stat.S_ISREG(info.st_mode)
            for _fd, _parts, info in _entries(top, lambda parent, parts, exc: None)
        )
    finally:
        os.close(top)
