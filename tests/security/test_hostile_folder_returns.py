"""Attack: a folder return of a tree the program shaped to break the answer (audit F6).

A file name that is not UTF-8 made the worker's answer unencodable (500 ``engine``
``invalid worker response``, the worker respawned); a 2000-level tree ended the recursive
walk with ``RecursionError`` (FAILED kind ``engine``). Folder-return failures are kind
``serialization`` (PROTOCOL §5.4). Each test shapes the tree in a program against a real
server with a real (reused) worker.
"""

from __future__ import annotations

import pytest
from raw_http import call_program, post_execute

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
