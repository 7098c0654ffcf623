"""``kcoral run --send``: local files and directories hashed for upload (CLIENT_API.md §11).

No large input's bytes are kept: each file is hashed as it is read here and read again only
while the request body sends it (``kcoral.local_folder.FileBlob``), so a 512 MiB input needs
a few MiB of the client's memory, not 512 MiB (it was read whole and then packed into a
copy). Small files keep the bytes they were hashed from (``KeptBudget``, one for all the
inputs)."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence

from kcoral.local_folder import (
    FileBlob,
    KeptBudget,
    LinkRefused,
    SentFileChanged,
    check_utf8_name,
    hash_file,
    hash_folder,
    special_file_refused,
)
from kcoral.protocol.errors import ValidationError
from kcoral.protocol.paths import conflicting_paths, normalize_workspace_path
from kcoral.run.worker_side import WORK_DIR


class LocalFileError(Exception):
    """An input that cannot be sent or an output that cannot be saved (exit status 1)."""


def collect_inputs(paths: Sequence[str]) -> list[tuple[str, FileBlob, bool]]:
    """Hash the ``--send`` files as ``(remote path, file, executable)``, sorted by path.

    A file goes under its base name, a directory under its own name with its layout;
    ``__pycache__`` entries and empty directories are skipped. Symlinks, special files, a
    directory reached twice, files changing while read and conflicting remote paths raise
    ``LocalFileError``.
    """
    files: dict[str, tuple[FileBlob, bool]] = {}
    budget = KeptBudget()
    given: dict[str, str] = {}
    for path in paths:
        # `--send bench --send bench` (or `bench/`) said "two inputs would both be sent as
        # 'bench/main.py'", as if two different inputs clashed
        first = given.get(os.path.abspath(path))
        if first is not None:
            same = (
                f"{path!r} is given twice"
                if first == path
                else f"{first!r} and {path!r} name the same input"
            )
            raise LocalFileError(f"--send: {same}; give it once")
        given[os.path.abspath(path)] = path
        name = os.path.basename(os.path.abspath(path))
        if not name:
            raise LocalFileError(f"--send {path!r}: cannot send the root directory")
        for remote, data, executable in _read_input(path, name, budget):
            if remote in files:
                raise LocalFileError(f"--send: two inputs would both be sent as {remote!r}")
            files[remote] = (data, executable)
    names = sorted(files)
    # Not neighbours in sorted order: 'a-b' sorts between 'a' and 'a/c' ('-' < '/').
    conflict = conflicting_paths(names)
    if conflict is not None:
        raise LocalFileError(
            f"--send: {conflict[0]!r} is both a file and a directory in the inputs"
        )
    return [(name, *files[name]) for name in names]


def _read_input(path: str, name: str, budget: KeptBudget) -> list[tuple[str, FileBlob, bool]]:
    info = _lstat(path)

    def check(relative: str, local: str) -> None:
        # while the folder is listed, before any file is read: a name the request cannot
        # carry was refused only once every file had been read (upload_folder's words)
        _check_remote_path(f"{name}/{relative}", local)

    try:
        if stat.S_ISREG(info.st_mode):
            _check_remote_path(name, path, in_folder=False)
            return [(name, hash_file(path, info, budget), _executable(info.st_mode))]
        if stat.S_ISLNK(info.st_mode):  # never followed: it could point anywhere
            raise LocalFileError(f"--send {path!r}: {_link_advice(path)}")
        if not stat.S_ISDIR(info.st_mode):
            raise LocalFileError(f"--send: {special_file_refused(path, info.st_mode)}")
        _check_remote_path(name, path, in_folder=False)  # the folder's own name
        files = hash_folder(path, skip=("__pycache__",), check=check, budget=budget)
    except LinkRefused as exc:
        raise LocalFileError("--send: " + exc.advice("send", "with a --send of its own")) from None
    except ValueError as exc:
        raise LocalFileError(f"--send: {exc}") from None
    except OSError as exc:
        raise LocalFileError(f"--send: cannot read {exc.filename!r}: {exc.strerror}") from None
    return [(f"{name}/{file.path}", file, _executable(file.mode)) for file in files]


#: Inputs smaller than this travel packed in one ``bytes`` upload, which the runner unpacks
#: (``kcoral.run.worker_side.pack_inputs``): a file upload each costs the server a part, a
#: blob and a write of its own, and 5000 files of 200 bytes took 2 to 3 times as long so.
SMALL_INPUT_BYTES = 1 << 20
#: The most bytes packed in all (held in memory, then joined); any more go as file uploads.
PACKED_INPUT_BYTES = 64 << 20


def split_inputs(
    inputs: Sequence[tuple[str, FileBlob, bool]],
) -> tuple[list[tuple[str, bytes, bool]], list[tuple[str, FileBlob, bool]]]:
    """The inputs to pack, read now (small files, ``PACKED_INPUT_BYTES`` of them in all), and
    the inputs to upload as files, each read only as the request sends it (the rest):
    client memory stays bounded whatever the inputs weigh. ``SentFileChanged`` when a
    small file no longer holds what was hashed."""
    packed: list[tuple[str, bytes, bool]] = []
    uploaded: list[tuple[str, FileBlob, bool]] = []
    room = PACKED_INPUT_BYTES
    for remote, blob, executable in inputs:
        if blob.size < SMALL_INPUT_BYTES and blob.size <= room:
            packed.append((remote, blob.read(), executable))
            room -= blob.size
        else:
            uploaded.append((remote, blob, executable))
    return packed, uploaded


def changed_input(exc: SentFileChanged) -> str:
    """What an input that changed between its hashing and its sending says (nothing ran):
    the folder's advice, to upload it again in a new Program, is not ``kcoral run``'s."""
    changed = f"{exc.file!r} changed after kcoral run read it ({exc.reason})"
    return f"--send: {changed}; nothing was run: run again"


def _check_remote_path(remote: str, local: str, *, in_folder: bool = True) -> None:
    """``ValidationError`` when the request cannot carry ``remote``, the remote path of the
    local file ``local``: not UTF-8 (its bytes shown), or against PROTOCOL §5.5's rules below
    the tool's directory."""
    check_utf8_name(remote, local, "send", in_folder=in_folder)
    try:
        normalize_workspace_path(f"{WORK_DIR}/{remote}")
    except ValidationError as exc:
        raise ValidationError(f"{remote!r} cannot be sent: {exc}") from None


def _link_advice(path: str) -> str:
    """What to do about a symbolic link given to ``--send``: it said only "symbolic link
    cannot be sent", with no way out named."""
    try:
        target = os.readlink(path)
    except OSError:
        return "a symbolic link is not sent; give --send the path it points to"
    return f"a symbolic link (to {target!r}) is not sent; give --send {target!r} instead"


def _executable(mode: int) -> bool:
    return bool(mode & stat.S_IXUSR)


def _lstat(path: str) -> os.stat_result:
    try:
        return os.lstat(path)
    except OSError as exc:
        raise LocalFileError(f"--send {path!r}: {exc.strerror}") from None


def sent_as(local: str, send_paths: Sequence[str]) -> str | None:
    """The remote path the ``--send`` inputs give the local file ``local`` (a file goes under
    its base name, a directory's files under its name and their path in it), or None when
    no input holds it."""
    target = os.path.realpath(local)
    for path in send_paths:
        root = os.path.realpath(path)
        name = os.path.basename(os.path.abspath(path))
        if target == root:
            return name
        inside = os.path.relpath(target, root)
        if (
            os.path.isdir(root)
            and inside != os.pardir
            and not inside.startswith(os.pardir + os.sep)
        ):
            return "/".join([name, *inside.split(os.sep)])
    return None
