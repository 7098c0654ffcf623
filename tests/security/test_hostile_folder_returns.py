"""Attack: a folder return of a tree the program shaped to break the answer (audit F6).

A file name that is not UTF-8 made the worker's answer unencodable (500 ``engine``
``invalid worker response``, the worker respawned); a 2000-level tree ended the recursive
walk with ``RecursionError`` (FAILED kind ``engine``). Folder-return failures are kind
``serialization`` (PROTOCOL §5.4). Each test shapes the tree in a program against a real
server with a real (reused) worker.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from raw_http import call_program, post_execute
from server_process import start_server

PID = "import os\n\ndef main():\n    return os.getpid()\n"


def _folder_program(source: str) -> dict:
    program = call_program(source)
    program["instructions"].append({"op": "return", "key": "d", "kind": "folder", "path": "d"})
    return program


@pytest.fixture
def server(server_factory):
    return server_factory("--num-workers", "1", "--max-requests-per-worker", "0")


def _pid(url: str) -> int:
    answer = post_execute(url, call_program(PID))
    assert answer.status == 200 and answer.body["status"] == "COMPLETED", answer.raw[:2000]
    return answer.body["results"]["value"]["value"]


def test_a_folder_holding_a_name_that_is_not_utf8_fails_as_serialization_naming_it(
    server,
) -> None:
    before = _pid(server.url)
    source = (
        "import os\n\ndef main():\n    os.mkdir('d')\n    open(b'd/ok\\xff\\xfe', 'wb').close()\n"
    )
    answer = post_execute(server.url, _folder_program(source))
    assert answer.status == 200, answer.raw[:2000]
    error = answer.body["error"]
    assert answer.body["status"] == "FAILED" and error["kind"] == "serialization", error
    assert error["message"] == "'d/ok\\xff\\xfe' is not a valid UTF-8 name"
    assert "d" not in answer.body["results"]
    assert _pid(server.url) == before  # the answer was an answer: the worker goes on


def test_a_folder_2000_levels_deep_is_returned_whole(server) -> None:
    source = (
        "import os\n\ndef main():\n    path = 'd'\n    os.mkdir(path)\n"
        "    for _ in range(2000):\n        path += '/a'\n        os.mkdir(path)\n"
        "    open(path + '/f', 'w').write('bottom')\n"
    )
    answer = post_execute(server.url, _folder_program(source), timeout=120.0)
    assert answer.status == 200, answer.raw[:2000]
    assert answer.body["status"] == "COMPLETED", answer.body.get("error")
    folder = answer.body["results"]["d"]
    bottom = "/".join(["a"] * 2000)
    assert folder["directories"] == ["/".join(["a"] * n) for n in range(1, 2001)]
    assert list(folder["files"]) == [f"{bottom}/f"]
    assert answer.parts[folder["files"][f"{bottom}/f"]["part"]] == b"bottom"


def test_a_2000_level_folder_with_a_sibling_at_each_level_is_returned_under_1024_open_files(
    tmp_path: Path,
) -> None:
    # The walk held one descriptor per level that still had a subdirectory to do, so this
    # failed with 'cannot list ...: Too many open files' (a 4000-byte path in the message).
    server = start_server(
        tmp_path / "server",
        ["--num-workers", "1"],
        open_files=(1024, 1024),  # a common hard limit
    )
    try:
        source = (
            "import os\n\ndef main():\n    os.mkdir('d')\n    fd = os.open('d', os.O_RDONLY)\n"
            "    for _ in range(2000):\n        os.mkdir('b', dir_fd=fd)\n"
            "        os.mkdir('a', dir_fd=fd)\n"
            "        child = os.open('a', os.O_RDONLY, dir_fd=fd)\n"
            "        os.close(fd)\n        fd = child\n"
            "    os.close(os.open('f', os.O_WRONLY | os.O_CREAT, dir_fd=fd))\n"
        )
        answer = post_execute(server.url, _folder_program(source), timeout=120.0)
    finally:
        server.stop()
    assert answer.status == 200, answer.raw[:2000]
    assert answer.body["status"] == "COMPLETED", str(answer.body.get("error"))[:2000]
    folder = answer.body["results"]["d"]
    chains = ["/".join(["a"] * n) for n in range(2001)]
    expected = sorted([*chains[1:], *(f"{chain}/b".lstrip("/") for chain in chains[:-1])])
    assert folder["directories"] == expected
    assert list(folder["files"]) == [f"{chains[-1]}/f"]


def test_a_folder_holding_a_name_with_a_backslash_fails_as_serialization_naming_it(
    server,
) -> None:
    # Linux allows the name; a returned path cannot hold it (PROTOCOL §5.5). The server
    # sent it in the manifest, and the client refused the whole answer (ProtocolError).
    source = (
        "import os\n\ndef main():\n    os.makedirs('d/sub')\n"
        "    open('d/sub/a\\\\b', 'w').close()\n"
    )
    answer = post_execute(server.url, _folder_program(source))
    assert answer.status == 200, answer.raw[:2000]
    error = answer.body["error"]
    assert answer.body["status"] == "FAILED" and error["kind"] == "serialization", error
    assert error["message"] == "'d/sub/a\\\\b': a returned name cannot hold a backslash"
    assert "d" not in answer.body["results"]


def test_a_folder_path_longer_than_4096_bytes_fails_as_serialization(server) -> None:
    # 17 levels of 250-byte names: each name is fine, the path in the folder is not.
    source = (
        "import os\n\ndef main():\n    os.mkdir('d')\n    fd = os.open('d', os.O_RDONLY)\n"
        "    for _ in range(17):\n        os.mkdir('b' * 250, dir_fd=fd)\n"
        "        fd = os.open('b' * 250, os.O_RDONLY, dir_fd=fd)\n"
    )
    answer = post_execute(server.url, _folder_program(source))
    assert answer.status == 200, answer.raw[:2000]
    error = answer.body["error"]
    assert answer.body["status"] == "FAILED" and error["kind"] == "serialization", error
    assert error["message"].endswith(": its path in the folder is longer than 4096 bytes")
    assert "d" not in answer.body["results"]
