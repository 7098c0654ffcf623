"""upload_folder (CLIENT_API.md §3.3): order, ids, and the all-or-nothing refusals."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from file_permissions import needs_file_permissions

from kcoral import Program
from kcoral.local_folder import read_folder
from kcoral.protocol.errors import ValidationError
from kcoral.protocol.paths import shown_path


def make_tree(root):
    (root / "b").mkdir(parents=True)
    (root / "a.txt").write_bytes(b"A")
    (root / ".hidden").write_bytes(b"H")
    (root / "b" / "c.bin").write_bytes(b"C")
    (root / "empty").mkdir()
    return root


def test_files_are_uploaded_in_destination_order_with_generated_ids(tmp_path):
    make_tree(tmp_path / "src")
    program = Program()
    program.upload(kind="bytes", value=b"x")
    program.upload_folder(tmp_path / "src", path="./in//")
    uploads = program.instructions[1:]
    assert [(u["id"], u["path"]) for u in uploads] == [
        ("upload_1", "in/.hidden"),
        ("upload_2", "in/a.txt"),
        ("upload_3", "in/b/c.bin"),
    ]
    assert all(u["kind"] == "file" for u in uploads)
    assert program.blobs[uploads[2]["blob"]] == b"C"
    assert program.upload(kind="bytes", value=b"y").id == "upload_4"


@pytest.mark.parametrize("top", [".", "./"])
def test_a_folder_uploaded_to_dot_lands_at_the_workspaces_top(tmp_path, top):
    # files3: `path="."` was refused ("path '.' is empty after normalization"), so a
    # folder's contents could not be placed where a program starts reading
    make_tree(tmp_path / "src")
    program = Program()
    program.upload_folder(tmp_path / "src", path=top)
    assert [u["path"] for u in program.instructions] == [".hidden", "a.txt", "b/c.bin"]
    with pytest.raises(ValueError, match="is uploaded twice"):
        program.upload_folder(tmp_path / "src", path=".")  # the same files again


def test_an_empty_folder_adds_nothing(tmp_path):
    (tmp_path / "e" / "f").mkdir(parents=True)
    program = Program()
    program.upload_folder(tmp_path / "e", path="x")
    assert program.instructions == []


def assert_refused(program, folder, path="dst", error=ValueError):
    before = program.instructions
    with pytest.raises(error):
        program.upload_folder(folder, path=path)
    assert program.instructions == before


def test_a_symlink_anywhere_is_refused(tmp_path):
    src = make_tree(tmp_path / "src")
    os.symlink(src / "a.txt", src / "b" / "link")
    assert_refused(Program(), src)
    os.symlink(src, tmp_path / "top-link")
    assert_refused(Program(), tmp_path / "top-link")


def test_a_fifo_and_a_socket_are_refused(tmp_path):
    src = make_tree(tmp_path / "src")
    os.mkfifo(src / "b" / "pipe")
    assert_refused(Program(), src)
    os.unlink(src / "b" / "pipe")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(src / "sock"))
        assert_refused(Program(), src)


def test_a_directory_reached_twice_is_refused(tmp_path, monkeypatch):
    src = make_tree(tmp_path / "src")
    (src / "again").mkdir()
    # A bind mount needs privileges; fake the walk seeing one directory twice instead.
    real_stat = os.stat

    def fake_stat(path, *args, dir_fd=None, **kwargs):
        if path == "again" and dir_fd is not None:
            path = "b"
        return real_stat(path, *args, dir_fd=dir_fd, **kwargs)

    monkeypatch.setattr(os, "stat", fake_stat)
    assert_refused(Program(), src)


def test_a_file_changing_while_read_is_refused(tmp_path, monkeypatch):
    src = make_tree(tmp_path / "src")
    real_read = os.read
    grown = []

    def growing_read(fd, size):
        data = real_read(fd, size)
        if data and not grown:
            grown.append(True)
            with open(src / ".hidden", "ab") as other:  # the first file read
                other.write(b"more")
        return data

    monkeypatch.setattr(os, "read", growing_read)
    assert_refused(Program(), src)


def test_destination_conflicts_with_earlier_uploads_are_refused(tmp_path):
    src = make_tree(tmp_path / "src")
    program = Program()
    program.upload_file(blob=b"x", path="dst/a.txt")
    assert_refused(program, src)
    other = Program()
    other.upload_file(blob=b"x", path="dst")
    assert_refused(other, src)


def test_bad_destination_and_missing_or_non_directory_folders(tmp_path):
    src = make_tree(tmp_path / "src")
    assert_refused(Program(), src, path="../up", error=ValidationError)
    assert_refused(Program(), tmp_path / "missing", error=FileNotFoundError)
    assert_refused(Program(), src / "a.txt", error=NotADirectoryError)


def test_a_local_name_that_is_no_valid_workspace_path_is_refused(tmp_path):
    src = make_tree(tmp_path / "src")
    (src / "back\\slash").write_bytes(b"x")
    assert_refused(Program(), src, error=ValidationError)


@needs_file_permissions
@pytest.mark.file_permissions
def test_an_unreadable_file_is_an_os_error(tmp_path):
    src = make_tree(tmp_path / "src")
    (src / "a.txt").chmod(0)
    assert_refused(Program(), src, error=PermissionError)


def test_deep_trees_are_walked_without_recursion(tmp_path):
    path = tmp_path / "deep"
    path.mkdir()
    current = os.open(path, os.O_RDONLY)
    depth = 400
    for _ in range(depth):
        os.mkdir("d", dir_fd=current)
        nxt = os.open("d", os.O_RDONLY, dir_fd=current)
        os.close(current)
        current = nxt
    fd = os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=current)
    os.write(fd, b"!")
    os.close(fd)
    os.close(current)
    limit = sys.getrecursionlimit()
    frames = 0
    frame = sys._getframe()
    while frame is not None:
        frames, frame = frames + 1, frame.f_back
    sys.setrecursionlimit(frames + 150)  # a recursive walk of 400 levels would fail now
    try:
        files = read_folder(path)
    finally:
        sys.setrecursionlimit(limit)
    assert [(file.path, file.data) for file in files] == [("d/" * depth + "leaf", b"!")]


def nest(folder, names, leaf=b"!"):
    """Directories ``names`` nested in ``folder`` with a file ``leaf`` at the bottom, made
    through descriptors: the whole path may be longer than the OS takes in one string."""
    current = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    for name in names:
        os.mkdir(name, dir_fd=current)
        below = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=current)
        os.close(current)
        current = below
    fd = os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=current)
    os.write(fd, leaf)
    os.close(fd)
    os.close(current)
    return "/".join([*names, "leaf"])


def test_a_folder_past_path_max_uploads_while_its_paths_fit_the_protocol(tmp_path):
    # The walk opened absolute paths: past PATH_MAX (4096 bytes) it failed with "File name
    # too long", though the destination paths were well within the protocol's 4096 bytes.
    name = "n" * 250
    src = tmp_path.joinpath(*[name] * 12, "src")  # about 3100 bytes: the OS takes it
    src.mkdir(parents=True)
    relative = nest(src, [name] * 6)
    assert len(f"{src}/{relative}") > 4096
    program = Program()
    program.upload_folder(src, path="in")
    [upload] = program.instructions
    assert upload["path"] == f"in/{relative}"
    assert program.blobs[upload["blob"]] == b"!"
    # A path the protocol cannot carry gets the protocol's error, not the OS's.
    (tmp_path / "far").mkdir()
    nest(tmp_path / "far", [name] * 17)  # 4267 bytes in the folder
    with pytest.raises(ValidationError, match="longer than 4096 bytes"):
        Program().upload_folder(tmp_path / "far", path="in")


def test_building_a_program_never_imports_torch(tmp_path):
    code = (
        "import sys, numpy as np, kcoral\n"
        "p = kcoral.Program(); p.upload(kind='tensor', value=np.zeros(2))\n"
        "assert 'torch' not in sys.modules and 'tornado' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_tree_with_one_over_long_path_fails_before_any_file_is_read_naming_it(
    tmp_path, monkeypatch
):
    # One path past the protocol's 4096 bytes failed only after every file was read (a
    # 300 MB tree: 300 MB read, 330 MB resident), and the message did not say which path.
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "big").write_bytes(b"x" * 100_000)  # walked and read first before
    (src / "b").mkdir()
    nest(src / "b", ["n" * 250] * 17)  # 4267 bytes in the folder
    read_sizes = []
    real_read = os.read

    def counting_read(fd, size):
        read_sizes.append(size)
        return real_read(fd, size)

    monkeypatch.setattr(os, "read", counting_read)
    with pytest.raises(ValidationError, match="longer than 4096 bytes") as refused:
        Program().upload_folder(src, path="in")
    assert read_sizes == []
    message = str(refused.value)
    # the shown path keeps the first 60 characters of the local path (pytest's tmp_path
    # alone may be longer: CI's was cut inside it), then "...", then its leaf
    assert message.startswith(f"'{str(src / 'b' / 'nnn')[:60]}")
    assert "..." in message and "/leaf' cannot be uploaded" in message
    assert len(message) < 300  # the path shown keeps its start and its leaf, not kilobytes


def test_a_name_that_is_not_utf8_is_shown_as_its_bytes_with_what_to_do(tmp_path) -> None:
    # it read "'.../\udcff\udcfe.bin' cannot be uploaded: path 'in/\udcff...' is not
    # valid UTF-8": Python's surrogates, which no listing shows, and no way out
    src = tmp_path / "src"
    src.mkdir()
    (src / "fine.txt").write_bytes(b"x")
    with open(os.fsencode(src) + b"/\xff\xfe.bin", "wb") as odd:
        odd.write(b"z")
    with pytest.raises(ValidationError) as refused:
        Program().upload_folder(src, path="in")
    shown = shown_path(f"{src}/\\xff\\xfe.bin")  # a long tmp_path is cut, as any path
    assert str(refused.value) == (
        f"'{shown}' cannot be uploaded: its name is not UTF-8, as workspace paths are: "
        "rename it, or upload the folder without it"
    )


def test_a_folder_given_as_a_symbolic_link_names_the_folder_to_pass_instead(tmp_path) -> None:
    # a data folder linked from a bigger disk read "'data' is a symbolic link; refused"
    real = tmp_path / "disk" / "data"
    real.mkdir(parents=True)
    (real / "x.bin").write_bytes(b"x")
    link = tmp_path / "data"
    link.symlink_to("disk/data")
    with pytest.raises(ValueError) as refused:
        Program().upload_folder(link, path="in")
    assert str(refused.value) == (
        f"'{link}' is a symbolic link (to 'disk/data'), which is not followed: pass the "
        f"folder it points to, '{real.resolve()}'"
    )


@pytest.mark.parametrize("target", ["notes.txt", "gone"])
def test_a_symbolic_link_to_a_file_or_to_nothing_names_no_folder_to_pass(tmp_path, target) -> None:
    # a link to a file, or a dangling one, read "pass the folder it points to, '.../notes.txt'"
    (tmp_path / "notes.txt").write_bytes(b"x")
    link = tmp_path / "data"
    link.symlink_to(target)
    with pytest.raises(ValueError) as refused:
        Program().upload_folder(link, path="in")
    assert str(refused.value) == f"'{link}' is a symbolic link (to '{target}'), and not to a folder"
