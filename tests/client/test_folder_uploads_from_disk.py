"""upload_folder's files go from disk into the request body (CLIENT_API §3.3): bounded
client memory, the same bytes on the server, and a file changed after it was hashed fails
the request before its body is complete, so nothing runs."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import textwrap

import pytest

from kcoral import Client, Program, local_folder
from kcoral.local_folder import KEPT_FILE_BYTES, SentFileChanged

# The workspace's files as the worker sees them, and a marker written outside it: a program
# that ran leaves the marker (the test servers run without a sandbox).
#: A file read again as it is sent (a smaller one keeps the bytes it was hashed from).
STREAMED = KEPT_FILE_BYTES + 1
_DIGESTS = """
import hashlib, os

def digests(marker):
    open(marker, "w").close()
    found = {}
    for top, _, names in os.walk("in"):
        for name in names:
            path = os.path.join(top, name)
            with open(path, "rb") as file:
                found[os.path.relpath(path, "in")] = hashlib.sha256(file.read()).hexdigest()
    return found
"""


def digests_program(folder, marker) -> Program:
    program = Program()
    program.upload_folder(folder, path="in")
    module = program.upload(kind="module", source=_DIGESTS)
    function = program.get_function(module=module, name="digests")
    program.return_(key="digests", value=program.run(fn=function, args=[str(marker)]))
    return program


def local_digests(folder) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in folder.rglob("*")
        if path.is_file()
    }


def make_folder(folder, sizes: dict[str, int]):
    for name, size in sizes.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(os.urandom(size))
    return folder


_MEASURE = textwrap.dedent(
    """
    import json, resource, sys
    from kcoral import Client
    sys.path.insert(0, sys.argv[4])
    from test_folder_uploads_from_disk import digests_program

    def peak():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    before = peak()
    with Client(sys.argv[1]) as client:
        result = client.execute(digests_program(sys.argv[2], sys.argv[3]))
    print(json.dumps({"grown": peak() - before, "digests": result.results["digests"]}))
    """
)


def test_a_large_folder_reaches_the_server_byte_identical_with_bounded_client_memory(
    kcoral_server, tmp_path
):
    # Every file was read into the Program: a 4 GiB folder needed 4 GiB of the client's
    # memory (1 GiB measured: 1320 MiB peak, now 43 MiB). Here 192 MiB, under the server's
    # default 256 MiB body, and a bound far below it but far above a few 1 MiB chunks.
    folder = make_folder(tmp_path / "big", {"a.bin": 64 << 20, "b/c.bin": 64 << 20, "d": 64 << 20})
    make_folder(folder, {"small.txt": 10, "empty": 0})
    marker = tmp_path / "ran"
    measured = subprocess.run(
        [
            sys.executable,
            "-c",
            _MEASURE,
            kcoral_server.url,
            folder,
            marker,
            os.path.dirname(__file__),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    report = json.loads(measured.stdout)
    assert report["digests"] == local_digests(folder)
    assert report["grown"] < 48 << 20, f"client peak memory grew {report['grown'] >> 20} MiB"


def test_a_file_changed_after_upload_folder_fails_the_request_and_nothing_runs(
    kcoral_server, tmp_path
):
    folder = make_folder(tmp_path / "src", {"a.bin": 3 << 20, "b.txt": 5})
    marker = tmp_path / "ran"
    program = digests_program(folder, marker)
    (folder / "a.bin").write_bytes(os.urandom(3 << 20))  # same size, other bytes
    with Client(kcoral_server.url) as client:
        with pytest.raises(SentFileChanged) as changed:
            client.execute(program)
        assert str(changed.value) == (
            f"{str(folder / 'a.bin')!r} changed after upload_folder hashed it (its bytes "
            "changed); nothing was run: upload the folder again, in a new Program"
        )
        assert not marker.exists()
        # the server keeps serving, and the folder added again goes as it is now
        result = client.execute(digests_program(folder, marker))
    assert result.results["digests"] == local_digests(folder)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda fd: os.pwrite(fd, b"X" * 16, 0), id="bytes-already-sent"),
        pytest.param(lambda fd: os.pwrite(fd, b"X" * 16, (3 << 20) - 16), id="bytes-not-yet-sent"),
        pytest.param(lambda fd: os.ftruncate(fd, 1 << 20), id="cut-short"),
    ],
)
def test_a_file_changed_while_its_bytes_are_sent_fails_the_request_and_nothing_runs(
    kcoral_server, tmp_path, monkeypatch, change
):
    folder = make_folder(tmp_path / "src", {"a.bin": 3 << 20})
    marker = tmp_path / "ran"
    program = digests_program(folder, marker)
    real_read = os.read
    changed = []
    inode = (folder / "a.bin").stat().st_ino

    def changing_read(fd, size):
        data = real_read(fd, size)
        if data and not changed and os.fstat(fd).st_ino == inode:
            # the file's first MiB is read to be sent: change the file now
            changed.append(True)
            with open(folder / "a.bin", "r+b") as file:
                change(file.fileno())
        return data

    with Client(kcoral_server.url) as client:
        client.health()
        monkeypatch.setattr(os, "read", changing_read)
        with pytest.raises(SentFileChanged, match="changed after upload_folder hashed it"):
            client.execute(program)
        monkeypatch.setattr(os, "read", real_read)
        assert changed and not marker.exists()
        assert client.health()["status"] == "ok"


def test_a_removed_or_replaced_file_is_a_changed_file_not_an_unreachable_server(tmp_path):
    folder = make_folder(tmp_path / "src", {"gone": STREAMED, "link": STREAMED, "other": 10})
    program = Program()
    program.upload_folder(folder, path="in")
    blobs = {upload["path"]: upload["blob"] for upload in program.instructions}
    (folder / "gone").unlink()
    (folder / "link").unlink()
    (folder / "link").symlink_to(folder / "other")
    with pytest.raises(SentFileChanged, match=r"'[^']*/gone' changed .*No such file"):
        program.blobs[blobs["in/gone"]]
    with pytest.raises(SentFileChanged, match=r"'[^']*/link' changed .*cannot be read"):
        program.blobs[blobs["in/link"]]
    assert len(program.blobs[blobs["in/other"]]) == 10


def test_a_small_file_is_sent_as_it_was_hashed_whatever_becomes_of_it_and_a_large_one_is_checked(
    tmp_path,
):
    # a small file is read once, when it is hashed (opening and reading it again as it was
    # sent cost a folder of many small files 1.5 times the client CPU): the bytes sent are
    # exactly the bytes hashed, a snapshot; a large one is still read again, and checked
    folder = make_folder(tmp_path / "src", {"small": KEPT_FILE_BYTES, "large": STREAMED})
    hashed = {name: (folder / name).read_bytes() for name in ("small", "large")}
    program = Program()
    program.upload_folder(folder, path="in")
    blobs = {upload["path"]: upload["blob"] for upload in program.instructions}
    for name in ("small", "large"):
        (folder / name).write_bytes(os.urandom(len(hashed[name])))
    assert program.blobs[blobs["in/small"]] == hashed["small"]
    (folder / "small").unlink()
    assert program.blobs[blobs["in/small"]] == hashed["small"]
    with pytest.raises(SentFileChanged, match=r"'[^']*/large' changed .*its bytes changed"):
        program.blobs[blobs["in/large"]]


def test_the_small_files_one_folder_keeps_stay_within_their_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(local_folder, "KEPT_TOTAL_BYTES", 25)
    folder = make_folder(tmp_path / "src", {"a": 10, "b": 10, "c": 10, "d": 5})
    program = Program()
    program.upload_folder(folder, path="in")
    blobs = {upload["path"]: upload["blob"] for upload in program.instructions}
    for name in "abcd":
        (folder / name).unlink()
    assert [len(program.blobs[blobs[f"in/{name}"]]) for name in "abd"] == [10, 10, 5]
    with pytest.raises(SentFileChanged, match=r"'[^']*/c' changed .*No such file"):
        program.blobs[blobs["in/c"]]


class TerminalStream(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_large_upload_shows_its_progress_on_a_terminal_and_a_small_one_stays_silent(
    kcoral_server, monkeypatch
):
    stderr = TerminalStream()
    monkeypatch.setattr(sys, "stderr", stderr)
    with Client(kcoral_server.url) as client:
        small = Program()
        small.upload(kind="bytes", value=b"x" * 1000)
        client.execute(small)
        assert stderr.getvalue() == ""
        large = Program()
        large.upload(kind="bytes", value=os.urandom(64 << 20))
        client.execute(large)
    shown = stderr.getvalue()
    # the first attempt carries no blob (small, silent); the retry carries the 64 MiB: its
    # first piece drawn at once, then at most five redraws a second, then the final line
    first = shown.split("\r\x1b[K")[1]
    assert first.startswith("kcoral: upload: ") and " of 64.0 MiB (" in first
    final = shown.rsplit("\r\x1b[K", 1)[1]
    assert final.startswith("kcoral: upload: 64.0 MiB in ") and final.endswith("/s)\n")


@pytest.mark.parametrize("swap", ["directory-for-a-link", "file-for-a-fifo"])
def test_a_neighbour_swapping_an_entry_after_hashing_gets_nothing_read_through_it(tmp_path, swap):
    # another program of the user's machine swaps what upload_folder hashed for a link to
    # its own copy (same bytes: the hash alone would not tell) or a FIFO it holds open: the
    # walk at send time follows no link and opens no FIFO for a blocking read
    folder = make_folder(tmp_path / "src", {"sub/data": STREAMED})
    program = Program()
    program.upload_folder(folder, path="in")
    [upload] = program.instructions
    if swap == "directory-for-a-link":
        (folder / "sub").rename(tmp_path / "elsewhere")
        (folder / "sub").symlink_to(tmp_path / "elsewhere")
    else:
        (folder / "sub" / "data").unlink()
        os.mkfifo(folder / "sub" / "data")
    with pytest.raises(SentFileChanged, match=r"'[^']*/sub/data' changed after upload_folder"):
        program.blobs[upload["blob"]]


def test_a_relative_folder_is_sent_from_where_it_was_hashed_after_a_change_of_directory(
    tmp_path, monkeypatch
):
    # the files are read again at send time: a relative folder was looked up again from
    # the new working directory, where another 'src' or none was
    make_folder(tmp_path / "one" / "src", {"data": 10})
    make_folder(tmp_path / "two" / "src", {"data": 10})
    monkeypatch.chdir(tmp_path / "one")
    program = Program()
    program.upload_folder("src", path="in")
    [upload] = program.instructions
    monkeypatch.chdir(tmp_path / "two")
    assert program.blobs[upload["blob"]] == (tmp_path / "one" / "src" / "data").read_bytes()


def test_a_folder_named_through_a_link_and_dotdot_is_sent_from_where_it_was_hashed(
    tmp_path, monkeypatch
):
    # 'link/../data' is the folder beside the link's target, as the walk found it; the path
    # was folded by text (abspath) to './data', so every send read another folder or failed
    make_folder(tmp_path / "real" / "data", {"data": 10})
    (tmp_path / "real" / "inner").mkdir()
    make_folder(tmp_path / "data", {"data": 20})  # what folding by text finds instead
    (tmp_path / "link").symlink_to(tmp_path / "real" / "inner")
    monkeypatch.chdir(tmp_path)
    program = Program()
    program.upload_folder("link/../data", path="in")
    [upload] = program.instructions
    assert program.blobs[upload["blob"]] == (tmp_path / "real" / "data" / "data").read_bytes()
