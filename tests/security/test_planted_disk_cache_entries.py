"""Attack: a local user with write access to the disk cache plants entries in it.

The disk cache directory (SERVER §10) is shared by every server of the user and may be put
anywhere with ``--disk-cache-dir``; whoever can write there can put things at a blob's
path. The hash check keeps wrong bytes from being served; these tests pin what else such an
entry must not achieve: a named pipe at a blob's path blocked the request that named the
blob for ever (the server opened it and waited for a writer), and a symbolic link at a
blob's path made every later reference a ``CACHE_MISS`` (the upload that followed saw a
file there and stored nothing).
"""

from __future__ import annotations

import errno
import hashlib
import os
import threading

from identity_support import execute, file_program

import kcoral

# A deadlock guard only (no timing is measured): old code never answered at all.
HANG_GUARD_SECONDS = 60.0


def _entry_path(server, data: bytes) -> str:
    sha = hashlib.sha256(data).hexdigest()
    shard = server.disk_cache_dir / "v1" / sha[:2]
    shard.mkdir(parents=True, exist_ok=True)
    return str(shard / sha)


def _read_back(data: bytes) -> kcoral.Program:
    program = kcoral.Program()
    module = program.upload(kind="module", source="def f(p):\n    return open(p, 'rb').read()\n")
    program.upload_file(blob=data, path="in.bin")
    fn = program.get_function(module=module, name="f")
    program.return_(key="r", value=program.run(fn=fn, args=["in.bin"]))
    return program


def _release_reader(path: str) -> None:
    """Unblock a reader waiting on the pipe (old code), so that the server can stop."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        assert exc.errno in (errno.ENXIO, errno.ENOENT)  # nobody reading, or replaced
        return
    os.close(fd)


def test_a_named_pipe_planted_at_a_blobs_path_is_a_miss_and_the_program_completes(
    server_factory,
) -> None:
    server = server_factory()
    data = os.urandom(50_000)
    pipe = _entry_path(server, data)
    os.mkfifo(pipe, 0o600)
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(kcoral.Client(server.url).execute(_read_back(data)))
        except Exception as exc:  # reported below
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_SECONDS)
    if thread.is_alive():
        _release_reader(pipe)
        thread.join()
        raise AssertionError("the server waited on a named pipe planted in its disk cache")
    (result,) = outcome
    assert isinstance(result, kcoral.ProgramResult), result
    assert result.status == "COMPLETED"
    assert result["r"] == data
    assert "Traceback" not in server.stderr()


def test_a_symlink_planted_at_a_blobs_path_is_replaced_by_the_next_upload(
    server_factory, tmp_path
) -> None:
    server = server_factory()
    data = os.urandom(50_000)
    sha = hashlib.sha256(data).hexdigest()
    elsewhere = tmp_path / "elsewhere.bin"
    elsewhere.write_bytes(data)  # even the right bytes: a link is never followed
    link = _entry_path(server, data)
    os.symlink(elsewhere, link)

    first = kcoral.Client(server.url).execute(_read_back(data))  # a miss, then the upload
    assert first.status == "COMPLETED"
    assert first["r"] == data

    again = execute(server.url, file_program(sha), None)  # no token; by hash only
    assert again.status == 200
    assert not again.raw.startswith(b"{"), again.raw[:200]  # multipart: it ran, no CACHE_MISS
    assert data in again.raw
    assert not os.path.islink(link)
    assert elsewhere.read_bytes() == data  # the link's target was not written through
