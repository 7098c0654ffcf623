"""A request's workspace (``kcoral_server.storage.workspace``): private directories, capture files,
removal, and output read on the loop when small."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from kcoral_server.storage.workspace import NO_OUTPUT, Workspace


def test_a_workspace_is_private_and_its_capture_files_are_made_in_a_missing_directory(
    tmp_path: Path,
) -> None:
    output = tmp_path / "not" / "yet"
    workspace = Workspace.create(output, "123")
    try:
        assert workspace.path.name.startswith("kcoral-program-")
        assert stat.S_IMODE(os.stat(workspace.root).st_mode) == 0o700
        assert workspace.stdout_path == output / "123.out"
        assert workspace.stderr_path == output / "123.err"
        for path in (workspace.stdout_path, workspace.stderr_path):
            assert path.read_bytes() == b""
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
    finally:
        workspace.remove()
    assert not workspace.path.exists()


def test_an_empty_workspace_is_removed_at_once_and_a_used_one_is_left_for_the_walk(
    tmp_path: Path,
) -> None:
    empty = Workspace.create(tmp_path, None)
    assert empty.remove_if_empty() and not empty.path.exists()
    assert empty.remove_if_empty()  # already gone counts as removed
    used = Workspace.create(tmp_path, None)
    (used.path / "sub").mkdir()
    (used.path / "sub" / "file").write_bytes(b"data")
    assert not used.remove_if_empty() and used.path.exists()
    used.remove()
    assert not used.path.exists()


def test_small_output_is_read_directly_and_large_output_is_left_to_the_executor(
    tmp_path: Path,
) -> None:
    workspace = Workspace.create(tmp_path, "7")
    try:
        workspace.stdout_path.write_bytes(b"0123456789")
        workspace.stderr_path.write_bytes("é".encode())
        small = workspace.read_small_output(4, 64)
        assert small == workspace.read_output(4)
        assert (small.stdout, small.stdout_truncated) == ("0123", True)
        assert (small.stderr, small.stderr_truncated) == ("é", False)
        assert workspace.read_small_output(4, 11) is None
        workspace.stderr_path.unlink()  # a missing capture file reads as empty
        assert workspace.read_small_output(100, 64).stderr == ""
        assert workspace.read_small_output(0, 64) is NO_OUTPUT
    finally:
        workspace.remove()
