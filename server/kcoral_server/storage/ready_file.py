"""The ``--ready-file``: where a server, a router or a node supervisor writes its URL once it
accepts requests, for whoever started it to read.

Who can reach what: the path is the user's choice, often in a folder others may write
(``/tmp``). Someone there can plant a link at the path, or at a temporary name next to it
that is known in advance, before the process starts; writing through it would overwrite
the file it points at (any file this user may write) with the URL. So the URL goes into a
new file of a random name, created exclusively and never through a link, which is then
renamed over the path: a link there is replaced, never written through, and a reader never
sees half a URL. Where the rename is refused (another user's link or file at the path in a
sticky folder such as ``/tmp``), the process says so in one line and exits 1.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from pathlib import Path

_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def ready_file_problem(path: Path) -> str | None:
    """Why the URL could not be written to ``path`` (a folder, or in a folder that does not
    exist), else None: checked before anything starts, as the write comes only once the
    server (or router) listens, where it failed with a traceback after start-up."""
    if path.is_dir():
        return f"{path} is a folder"
    if not path.parent.is_dir():
        return f"{path}: no folder {path.parent}"
    return None


def write_ready_file(path: str | os.PathLike[str], url: str) -> None:
    """Write ``url`` and a newline to ``path`` (replacing what is there, a link included)."""
    path = Path(path)
    while True:
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(temporary, _NEW_FILE, 0o666)  # the umask applies, as for open()
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(url + "\n")
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def try_write_ready_file(path: str | os.PathLike[str], url: str) -> str | None:
    """``write_ready_file``, or the one line that says why it failed (None once written):
    whoever waits for the file would wait for ever, so the caller stops."""
    try:
        write_ready_file(path, url)
    except OSError as exc:
        return ready_file_write_problem(path, exc)
    return None


def ready_file_write_problem(path: str | os.PathLike[str], exc: OSError) -> str:
    """The one line that says why ``path`` could not be written, and what to do."""
    said = f"cannot write --ready-file {os.fspath(path)}: {exc.strerror or exc}"
    if exc.errno == errno.EPERM:
        # a sticky folder (/tmp) refuses to replace what another user owns there
        said += " (another user's file or link may be there: choose a path of your own)"
    return said
