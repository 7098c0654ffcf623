"""The tool's outputs on the worker side of ``kcoral run`` (CLIENT_API.md §11): what
``--fetch`` names is copied into the returned folder, and the runner's report says what did
not come back and why (``missing``, ``skipped``, ``links``).

Part of the runner module ``kcoral run`` uploads (``kcoral.run.command.runner_source``), so
it stays plain: standard library only, nothing done at import time.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable
from typing import Any

from kcoral.run.worker_tree import (
    DIRECTORY_FLAGS,
    FILE_FLAGS,
    FOLLOWING_FLAGS,
    TreeWriter,
    enter_from,
    entries,
)

NCU_REPORT = "capture.ncu-rep"


def new_report() -> dict[str, Any]:
    """The runner's report before the tool ran: how it ended and what did not come back."""
    report: dict[str, Any] = dict.fromkeys(("exit_code", "signal", "error"))
    report.update(missing=[], skipped=[], links=[])
    return report


def collect_outputs(
    tool: str, work: str, outputs: str, fetch: Iterable[str], report: dict[str, Any]
) -> None:
    """Copy each ``fetch`` path from ``work`` into ``outputs``, leave there only what a
    folder return carries, and name in ``report`` what did not come back."""
    for path in outermost_paths(fetch):
        problem = _fetch(work, outputs, path, report)
        if problem:
            report["missing"].append({"path": path, "reason": problem})
    _drop_untransferable(outputs, report)
    if tool == "ncu" and not os.path.isfile(os.path.join(outputs, NCU_REPORT)):
        report["missing"].append({"path": NCU_REPORT, "reason": "ncu wrote no report"})
    if tool == "run-iket" and not _has_files(outputs):
        report["missing"].append({"path": ".", "reason": "run-iket wrote no file"})


#: how many names a missing output's reason lists of the directory it was looked for in
_NAMES_SHOWN = 6


def _what_is_there(work: str, parts: list[str]) -> str:
    """What the deepest existing directory on a missing output's path holds, so that a
    misspelt ``--fetch`` shows the name it meant: ``the tool's directory holds main.py,
    res/``. A name that is not UTF-8 is escaped (the report travels as JSON text)."""
    shown, directory = "the tool's directory", work
    for index, name in enumerate(parts[:-1]):
        below = os.path.join(directory, name)
        if not os.path.isdir(below):
            break
        shown, directory = "/".join(parts[: index + 1]) + "/", below
    try:
        names = sorted(os.listdir(os.fsencode(directory)))
    except OSError:
        return f"{shown} cannot be listed"
    if not names:
        return f"{shown} is empty"
    listed = []
    for entry in names[:_NAMES_SHOWN]:
        slash = "/" if os.path.isdir(os.path.join(os.fsencode(directory), entry)) else ""
        listed.append(entry.decode("utf-8", "backslashreplace") + slash)
    more = len(names) - len(listed)
    return f"{shown} holds {', '.join(listed)}" + (f" and {more} more" if more else "")


def outermost_paths(paths: Iterable[str]) -> list[str]:
    """Sorted, duplicate-free normalized paths without those inside another listed path."""
    kept: list[str] = []
    for path in sorted(set(paths)):
        if not any(path.startswith(parent + "/") for parent in kept):
            kept.append(path)
    return kept


def _fetch(work: str, outputs: str, path: str, report: dict[str, Any]) -> str | None:
    """Copy ``work/path`` to ``outputs/path``; returns why it could not, or ``None``.

    Relative to directory descriptors, like the inputs: a tree the tool made below the work
    directory may be deeper than PATH_MAX allows from '/' ('File name too long'). An entry
    below a fetched directory that cannot be read (a tool's ``chmod 000``) is a missing
    output of its own and the rest is copied: one stopped the whole copy, losing the
    entries sorted after it."""
    parts = path.split("/")
    parent = os.open(work, DIRECTORY_FLAGS)
    writer: TreeWriter | None = None
    try:
        for name in parts[:-1]:  # a symlinked parent is followed, as a path would be
            parent = enter_from(parent, os.open(name, FOLLOWING_FLAGS, dir_fd=parent))
        info = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
        if stat.S_ISLNK(info.st_mode):
            return "is a symbolic link (links are not fetched)"
        if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
            return "is not a regular file or directory"
        writer = TreeWriter(outputs, "outputs")
        opened = os.open(parts[-1], FILE_FLAGS, dir_fd=parent)
        try:
            if stat.S_ISREG(info.st_mode):
                writer.copy_file(parts, opened)
            else:
                writer.make_directory(parts)
                _copy_tree(opened, parts, writer, report)
        finally:
            os.close(opened)
    except FileNotFoundError:
        return f"not found; {_what_is_there(work, parts)}"
    except OSError as exc:
        return exc.strerror or str(exc)
    except ValueError as exc:
        return str(exc)
    finally:
        if writer is not None:
            writer.close()
        os.close(parent)
    return None


def _copy_tree(source: int, parts: list[str], writer: TreeWriter, report: dict[str, Any]) -> None:
    """Copy regular files and directories (empty ones too); other entries are skipped, and
    unreadable ones are missing outputs."""
    missing = report["missing"]

    def unreadable(_parent: int, below: list[str], exc: OSError) -> None:
        missing.append(_unreadable([*parts, *below], exc))

    for directory, below, info in entries(source, unreadable):
        if stat.S_ISDIR(info.st_mode):
            writer.make_directory([*parts, *below])
        elif stat.S_ISREG(info.st_mode):
            try:
                fd = os.open(below[-1], FILE_FLAGS, dir_fd=directory)
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

    top = os.open(outputs, DIRECTORY_FLAGS)
    above = os.open(os.path.dirname(outputs), DIRECTORY_FLAGS)
    try:
        for directory, parts, info in entries(top, unreadable, _travels):
            problem = _name_problem(parts[-1])
            if problem is not None:
                if _moved_away(directory, parts[-1], above, len(missing)):
                    missing.append({"path": _reported(parts), "reason": f"{problem}; not returned"})
            elif stat.S_ISREG(info.st_mode):
                try:
                    os.close(os.open(parts[-1], FILE_FLAGS, dir_fd=directory))
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
    top = os.open(directory, DIRECTORY_FLAGS)
    try:
        return any(
            stat.S_ISREG(info.st_mode)
            for _fd, _parts, info in entries(top, lambda parent, parts, exc: None)
        )
    finally:
        os.close(top)
