"""A ``%%kcoral --folder`` whose file changes between its hashing and its send (a training
run writing checkpoints into it, say), in the shell of the Jupyter tests (real CPU server):
the cell says so in two lines, cause and what to do, where it showed a ``ValueError``
traceback through the client's transport ending in a script's advice ("upload the folder
again, in a new Program"), which a cell, built anew each run, does not need."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kcoral_jupyter.cell_errors import FolderChangedError

from kcoral.local_folder import KEPT_FILE_BYTES
from kcoral.program import Program


def test_a_folder_changed_while_its_cell_is_sent_says_so_in_two_lines(
    shell: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    written = folder / "weights.bin"
    written.write_bytes(b"x" * (KEPT_FILE_BYTES + 1))  # read again as sent (a small one is not)
    hashed = Program.upload_folder

    def then_changed(self: Program, *args: Any, **kwargs: Any) -> Any:
        uploaded = hashed(self, *args, **kwargs)
        written.write_bytes(b"y" * (KEPT_FILE_BYTES + 2))  # after the hash, before the send
        return uploaded

    monkeypatch.setattr(Program, "upload_folder", then_changed)
    with pytest.raises(FolderChangedError) as caught:
        shell.run_cell_magic("kcoral", f"--folder {folder}:data", "1\n")
    lines = caught.value._render_traceback_()
    assert len(lines) == 2, lines
    assert lines[0].startswith("FolderChangedError: ")
    assert "weights.bin" in lines[0] and lines[0].endswith("nothing was run"), lines
    assert lines[1] == "run the cell again once the folder's files stop changing"
