"""A malicious KCoral server's folder answer against the folder the user saves it to.

The attacker is the server: a real HTTP server on loopback answers ``/execute`` with a
folder return whose manifest names paths an honest server never sends (PROTOCOL §5.5,
§7.5): traversal, absolute paths, ``..`` smuggled as bytes that are not UTF-8, NUL,
backslashes, over-long names. The real client must refuse the answer (``ProtocolError``)
before anything is written; names that are odd but valid save inside the chosen folder
and nowhere else (CLIENT_API §7).
"""

from __future__ import annotations

import hashlib
import http.server
import json
from pathlib import Path

import pytest
from stand_in_http import serving

from kcoral import Client, Program
from kcoral.errors import ProtocolError
from kcoral.protocol.multipart import encode_multipart

pytestmark = pytest.mark.timeout(120)

DATA = b"planted"


def folder_answer(files: list[str], directories: list[str]) -> tuple[str, bytes]:
    """A COMPLETED multipart answer holding one folder return ``k``."""
    digest = hashlib.sha256(DATA).hexdigest()
    nodes = {
        path: {"type": "file", "size": len(DATA), "part": f"return:{i}", "sha256": digest}
        for i, path in enumerate(files)
    }
    result = {
        "status": "COMPLETED",
        "request_id": "4c1f9f40-6c55-4a47-9c1d-1a2b3c4d5e6f",
        "queue_ms": 0,
        "elapsed_ms": 1,
        "lease_wait_ms": 0,
        "lease_held_ms": 0,
        "stdout": "",
        "stderr": "",
        "stdout_truncated": False,
        "stderr_truncated": False,
        "results": {"k": {"type": "folder", "files": nodes, "directories": directories}},
    }
    parts = [("result", "application/json", json.dumps(result).encode())]
    parts += [(f"return:{i}", "application/octet-stream", DATA) for i in range(len(files))]
    content_type, chunks, _ = encode_multipart(parts)
    return content_type, b"".join(bytes(chunk) for chunk in chunks)


def executed(files: list[str], directories: list[str]):
    content_type, body = folder_answer(files, directories)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    program = Program()
    program.return_folder(key="k", path="out")
    with serving(Handler) as url, Client(url) as client:
        return client.execute(program)


def everything_under(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


@pytest.mark.parametrize(
    ("files", "directories"),
    [
        (["../escaped"], []),
        (["a/../../escaped"], ["a"]),
        ([], [".."]),
        (["/tmp/escaped"], []),
        ([], ["/tmp/escaped-dir"]),
        (["\udc2e\udc2e/escaped"], ["\udc2e\udc2e"]),  # '..' as bytes that are not UTF-8
        (["a\udcafescaped"], []),
        (["..\\escaped"], []),
        (["a\x00b"], []),
        (["."], []),
        ([""], []),
        (["a/"], []),
        (["a//b"], ["a"]),
        (["x" * 256], []),
        (["/".join(["y" * 200] * 21)], ["/".join(["y" * 200] * n) for n in range(1, 21)]),
        (["a"], ["a"]),
        (["b", "a"], []),
    ],
)
def test_a_folder_manifest_outside_the_path_rules_is_refused_before_anything_is_saved(
    files: list[str], directories: list[str]
) -> None:
    # refused while the answer is read: no ReturnedFolder exists to be saved anywhere
    with pytest.raises(ProtocolError, match="invalid folder manifest"):
        executed(files, directories)
    assert not Path("/tmp/escaped").exists() and not Path("/tmp/escaped-dir").exists()


def test_odd_but_valid_names_save_inside_the_chosen_folder_only(tmp_path: Path) -> None:
    files = sorted(["-dash", ".hidden", "．．/x", "é/ü", "new\nline", "sp ace"])
    result = executed(files, ["é", "．．"])
    result["k"].save(tmp_path / "dest")
    assert everything_under(tmp_path) == sorted(
        ["dest", *(f"dest/{name}" for name in [*files, "é", "．．"])]
    )
    assert (tmp_path / "dest" / "．．" / "x").read_bytes() == DATA
