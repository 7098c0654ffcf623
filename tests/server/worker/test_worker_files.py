"""File uploads and file/folder returns (PROTOCOL §5.1 file, §5.4, §5.5)."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess

import pytest
from kcoral_server.worker.failures import InstructionFailure
from kcoral_server.worker.files import Budget, collect_file
from worker_harness import blob, call, function, give_path, module, ref


def file_upload(path: str, sha: str, ident: str | None = None) -> dict:
    instruction = {"op": "upload", "kind": "file", "path": path, "blob": sha}
    if ident is not None:
        instruction["id"] = ident
    return instruction


def prepare(source: str) -> list[dict]:
    """A module whose top-level code shapes the workspace before the returns run."""
    return [module("setup", source)]


def test_a_file_upload_is_written_privately_and_its_handle_is_the_normalized_path(
    shared_worker,
):
    sha, data = blob(b"hello\n")
    source = (
        "import os, stat\n"
        "def inspect_file(path):\n"
        "    with open(path, 'rb') as f:\n        content = f.read().decode()\n"
        "    mode = stat.S_IMODE(os.stat(path).st_mode)\n"
        "    parent = stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode)\n"
        "    return [path, content, oct(mode), oct(parent)]\n"
    )
    result = shared_worker.run(
        [
            file_upload("./inputs//deep/hello.txt", sha, "p"),
            module("m", source),
            function("inspect", "m", "inspect_file"),
            call("info", "inspect", ref("p")),
            {"op": "return", "key": "info", "value": ref("info")},
        ],
        [(sha, data)],
    )
    assert result.finished.status == "COMPLETED", result.error
    assert [node["value"] for node in result.value("info")["value"]] == [
        "inputs/deep/hello.txt",
        "hello\n",
        "0o600",
        "0o700",
    ]


def test_a_file_upload_without_an_id_creates_no_handle_and_has_a_null_id(shared_worker):
    sha, data = blob(b"x")
    result = shared_worker.run(
        [module("m", "open('taken', 'w').close()\n"), file_upload("taken", sha)], [(sha, data)]
    )
    assert result.error["kind"] == "runtime"  # created exclusively: an existing file fails
    assert result.error["instruction_id"] is None
    assert result.error["instruction_index"] == 1


def test_a_file_upload_never_follows_a_symlink(shared_worker, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    sha, data = blob(b"x")
    source = f"import os\nos.symlink({str(outside)!r}, 'link')\n"
    result = shared_worker.run(
        [module("m", source), file_upload("link/f.txt", sha, "f")], [(sha, data)]
    )
    assert result.error["kind"] == "runtime"
    assert list(outside.iterdir()) == []


def test_file_and_folder_returns_snapshot_relative_to_the_original_workspace(shared_worker):
    source = (
        "import os\n"
        "os.makedirs('out/sub/empty')\n"
        "os.makedirs('out/b')\n"
        "open('out/a.txt', 'wb').write(b'A')\n"
        "open('out/.hidden', 'wb').write(b'')\n"
        "open('out/b/c.bin', 'wb').write(b'CC')\n"
        "os.mkdir('elsewhere')\n"
        "os.chdir('elsewhere')\n"  # returns still read from the original workspace
        "def name():\n    return 'out/a.txt'\n"
    )
    result = shared_worker.run(
        [
            module("m", source),
            function("name", "m", "name"),
            call("p", "name"),
            give_path("file", "file", ref("p")),
            give_path("folder", "folder", "./out/"),
            give_path("empty", "folder", "out/sub/empty"),
        ]
    )
    assert result.finished.status == "COMPLETED", result.error
    file_node, file_parts = result.returns["file"]
    assert file_node == {
        "type": "file",
        "size": 1,
        "part": "return:0",
        "sha256": hashlib.sha256(b"A").hexdigest(),
    }
    assert file_parts == [b"A"]
    folder, parts = result.returns["folder"]
    assert folder["type"] == "folder"
    assert list(folder["files"]) == [".hidden", "a.txt", "b/c.bin"]
    assert [n["part"] for n in folder["files"].values()] == ["return:1", "return:2", "return:3"]
    assert parts == [b"", b"A", b"CC"]
    assert folder["directories"] == ["b", "sub", "sub/empty"]
    assert result.value("empty") == {"type": "folder", "files": {}, "directories": []}


REFUSALS = {
    "missing": ("", "file", "nothing/here"),
    "file symlink": ("os.symlink('real', 'link')", "file", "link"),
    "symlink component": ("os.symlink('dir', 'dlink')", "file", "dlink/f"),
    "symlink inside a folder": ("os.symlink('real', 'dir/link')", "folder", "dir"),
    "fifo": ("os.mkfifo('pipe')", "file", "pipe"),
    "fifo inside a folder": ("os.mkfifo('dir/pipe')", "folder", "dir"),
    "socket": (
        "import socket; s = socket.socket(socket.AF_UNIX); s.bind('sock')",
        "file",
        "sock",
    ),
    "folder where a file is expected": ("", "file", "dir"),
    "file where a folder is expected": ("", "folder", "real"),
    "folder symlink": ("os.symlink('dir', 'dlink')", "folder", "dlink"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_file_and_folder_returns_refuse_unsafe_or_wrong_entries(shared_worker, case):
    extra, kind, path = REFUSALS[case]
    source = (
        "import os\nos.mkdir('dir')\nopen('real', 'w').write('r')\n"
        "open('dir/f', 'w').write('f')\n" + extra + "\n"
    )
    result = shared_worker.run([module("m", source), give_path("r", kind, path)])
    assert result.error["kind"] == "serialization", result.error
    assert result.error["instruction_op"] == "return"
    assert result.error["instruction_id"] is None
    assert result.returns == {}


@pytest.mark.parametrize("value", ["'../escape'", "'/abs'", "42", "''"])
def test_a_path_handle_must_hold_a_valid_workspace_path(shared_worker, value):
    source = f"def path():\n    return {value}\n"
    result = shared_worker.run(
        [
            module("m", source),
            function("f", "m", "path"),
            call("p", "f"),
            give_path("r", "file", ref("p")),
        ]
    )
    assert result.error["kind"] == "serialization"


def test_file_returns_are_limited_by_the_response_budget(shared_worker):
    source = "open('big', 'wb').write(b'x' * 100)\nopen('small', 'wb').write(b'y' * 10)\n"
    program = [
        module("m", source),
        give_path("small", "file", "small"),
        give_path("big", "file", "big"),
    ]
    fits = shared_worker.run(program, max_response_bytes=110)
    assert fits.finished.status == "COMPLETED", fits.error
    too_big = shared_worker.run(program, max_response_bytes=109)
    assert too_big.error["kind"] == "serialization"
    assert too_big.error["instruction_index"] == 2
    assert list(too_big.returns) == ["small"]


def test_a_directory_reached_twice_is_refused(shared_worker):
    if os.geteuid() != 0:
        pytest.skip("needs a bind mount")
    source = (
        "import os, subprocess\nos.makedirs('loop/inner')\n"
        "subprocess.run(['mount', '--bind', 'loop', 'loop/inner'], check=True)\n"
    )
    result = shared_worker.run([module("m", source), give_path("r", "folder", "loop")])
    try:
        if result.error and result.error["instruction_op"] == "upload":
            pytest.skip("bind mounts are not permitted here")
        assert result.error["kind"] == "serialization"
        assert "twice" in result.error["message"]
    finally:
        subprocess.run(["umount", str(result.workspace / "loop" / "inner")], check=False)


def test_a_file_that_changes_while_read_is_refused(tmp_path, monkeypatch):
    target = tmp_path / "growing"
    target.write_bytes(b"a" * 10)
    real_read = os.read

    def read_and_grow(fd: int, size: int) -> bytes:
        data = real_read(fd, size)
        with open(target, "ab") as handle:
            handle.write(b"more")
        return data

    monkeypatch.setattr(os, "read", read_and_grow)
    workspace = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(InstructionFailure) as failure:
            collect_file(workspace, "growing", Budget(1 << 20))
    finally:
        os.close(workspace)
    assert failure.value.kind == "serialization"
    assert "changed" in failure.value.message


def test_a_deep_path_in_a_failure_keeps_its_start_and_its_leaf_not_kilobytes(tmp_path):
    """Files soak: a deep unreadable entry's message held its whole ~4000-character path."""
    deep = "/".join(["d"] * 1500) + "/leaf.bin"
    workspace = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(InstructionFailure) as failure:
            collect_file(workspace, deep, Budget(1 << 20))
    finally:
        os.close(workspace)
    message = failure.value.message
    assert len(message) < 200, message
    assert message.startswith("'d/d/d/") and "/d/..." in message, message
    assert message.endswith("/d/leaf.bin' does not exist"), message


def test_an_uploaded_file_is_readable_by_module_top_level_code(shared_worker):
    sha, data = blob(b"config=1\n")
    result = shared_worker.run(
        [
            file_upload("cfg/settings.txt", sha),
            module("m", "CONTENT = open('cfg/settings.txt').read()\n"),
            function("c", "m", "CONTENT"),
            {"op": "return", "key": "c", "value": ref("c")},
        ],
        [(sha, data)],
    )
    assert result.value("c") == {"type": "string", "value": "config=1\n"}
    mode = (result.workspace / "cfg").stat().st_mode
    assert stat.S_IMODE(mode) == 0o700


COUNT_OPENS = (
    "import sys\n"
    "opens = {'on': True, 'count': 0}\n"
    "def _count(event, args):\n"
    "    if event == 'open' and opens['on']:\n"
    "        opens['count'] += 1\n"
    "sys.addaudithook(_count)\n"
    "def stop():\n"
    "    opens['on'] = False\n"
    "    return opens['count']\n"
)


def test_placing_a_deep_folders_uploads_opens_each_directory_once_not_per_file(start_worker):
    # Each file upload opened every level from the workspace: files x depth opens, ~2
    # million (7 s) for a 2000-level folder with a file at each level. Counted, not timed.
    depth = 300
    paths = [f"up/{'d/' * level}f" for level in range(depth)]
    blobs = [blob(path.encode()) for path in paths]
    checker = (
        "import os\n"
        "def read_back(paths):\n"
        "    return all(open(p, 'rb').read() == p.encode() for p in paths)\n"
    )
    result = start_worker().run(
        [
            module("counter", COUNT_OPENS),  # its hook sees the uploads placed below
            *[file_upload(path, sha) for path, (sha, _) in zip(paths, blobs, strict=True)],
            function("stop", "counter", "stop"),
            call("opens", "stop"),
            module("check", checker),
            function("read_back", "check", "read_back"),
            call("same", "read_back", paths),
            {"op": "return", "key": "opens", "value": ref("opens")},
            {"op": "return", "key": "same", "value": ref("same")},
        ],
        blobs,
    )
    assert result.finished.status == "COMPLETED", result.error
    assert result.value("same")["value"] is True
    opens = result.value("opens")["value"]
    assert opens <= 3 * depth, opens  # old code: 45450


def test_an_upload_after_code_that_swapped_a_directory_for_a_symlink_is_refused(
    shared_worker, tmp_path
):
    # The uploads' writer keeps directories open only between consecutive file uploads:
    # one held across this run would write b/y into the moved directory.
    outside = tmp_path / "outside"
    outside.mkdir()
    sha, data = blob(b"y")
    swap = (
        "import os\n"
        f"def swap():\n    os.rename('b', 'moved')\n    os.symlink({str(outside)!r}, 'b')\n"
    )
    result = shared_worker.run(
        [
            file_upload("b/x", sha),
            module("m", swap),
            function("swap", "m", "swap"),
            call("swapped", "swap"),
            file_upload("b/y", sha),
        ],
        [(sha, data)],
    )
    assert result.finished.status == "FAILED"
    assert result.error["message"].startswith("cannot write file 'b/y': a path component is")
    assert list(outside.iterdir()) == []
