"""``kcoral run --send`` refuses what it cannot send in the words ``upload_folder`` uses,
from the same functions (``kcoral.local_folder``), before reading any file.

A file name that is not UTF-8 was shown as Python's surrogates (``'proj/\\udcff\\udcfe.bin'
is not valid UTF-8``), with no way out, and only after every file of the folder had been
read; a FIFO read two ways (``'pipe': FIFO cannot be sent`` given alone, ``'proj/pipe' is a
FIFO; refused`` inside a folder). The real command line runs against a real server with a
token.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from run_as_a_user import ServerWithAToken, kcoral_run, server_with_a_token

#: ``kcoral run`` (``sys.argv[2:]``) with every name it opens written to the file ``sys.argv[1]``.
OPENS_RECORDED = """
import json, os, sys
from kcoral.cli import main

real_open, opened = os.open, []


def recording(path, *args, **kwargs):
    opened.append(os.fsdecode(path) if isinstance(path, (str, bytes)) else str(path))
    return real_open(path, *args, **kwargs)


os.open = recording
try:
    sys.exit(main(sys.argv[2:]))
finally:
    with open(sys.argv[1], "w") as record:
        json.dump(opened, record)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerWithAToken]:
    with server_with_a_token(tmp_path_factory.mktemp("sent-names")) as started:
        yield started


def test_a_name_that_is_not_utf8_is_shown_as_its_bytes_before_any_file_is_read(
    server: ServerWithAToken, tmp_path: Path
) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "a-first.bin").write_bytes(b"read before the name was checked")
    with open(os.fsencode(project) + b"/\xff\xfe.bin", "wb") as odd:
        odd.write(b"z")
    record = tmp_path / "opened.json"
    watched = ("-c", OPENS_RECORDED, str(record))
    argv = ("python", "--send", "proj", "--", "-c", "")
    done = kcoral_run(server, *argv, cwd=tmp_path, launcher=watched)
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        "kcoral run: --send: 'proj/\\xff\\xfe.bin' cannot be sent: its name is not UTF-8, as "
        "workspace paths are: rename it, or send the folder without it\n"
    )
    assert "a-first.bin" not in record.read_text(encoding="utf-8")  # listed, never opened


def test_a_file_given_alone_whose_name_is_not_utf8_says_to_rename_it(
    server: ServerWithAToken, tmp_path: Path
) -> None:
    with open(os.fsencode(tmp_path) + b"/caf\xe9.txt", "wb") as odd:
        odd.write(b"z")
    done = kcoral_run(server, "python", "--send", "caf\udce9.txt", "--", "-c", "", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        "kcoral run: --send: 'caf\\xe9.txt' cannot be sent: its name is not UTF-8, as "
        "workspace paths are: rename it\n"
    )


@pytest.mark.parametrize("sent", ["pipe", "proj"])
def test_a_fifo_reads_the_same_given_alone_or_inside_a_folder(
    server: ServerWithAToken, tmp_path: Path, sent: str
) -> None:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "main.py").write_text("")
    fifo = "pipe" if sent == "pipe" else "proj/pipe"
    os.mkfifo(tmp_path / fifo)
    done = kcoral_run(server, "python", "--send", sent, "--", "-c", "", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        f"kcoral run: --send: '{fifo}' is a FIFO; only regular files and folders are sent\n"
    )
