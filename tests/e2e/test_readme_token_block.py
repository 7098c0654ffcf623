"""The README's token block (after ``kcoral server --device cpu ...`` in "A quick tour"), run as
written: its first line makes a token file only its owner reads, its second starts a server
that requires it (on a free port instead of 8000, its disk cache in the test's directory), and
its third exports the token where a client finds it. Before, the README named
``--auth-token-file`` but said neither how to make a token nor how a client sends it."""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from server_process import start_server

README = Path(__file__).resolve().parents[2] / "README.md"

pytestmark = pytest.mark.timeout(200)

CLIENT = """\
import os

import kcoral

program = kcoral.Program()
module = program.upload(kind="module", source="def one():\\n    return 1\\n")
program.return_(key="one", value=program.run(fn=program.get_function(module=module, name="one")))
try:
    print(kcoral.Client(os.environ["URL"]).execute(program, timeout_seconds=60)["one"])
except kcoral.KCoralError as error:
    print(error.status_code)
"""


def token_block() -> list[str]:
    text = README.read_text(encoding="utf-8")
    after = text[text.index("You make the token") :]
    found = re.search(r"```bash\n(.*?)```", after, re.S)
    assert found is not None, "the README's token block is gone"
    return found.group(1).strip().splitlines()


def client_answer(directory: Path, url: str, before: str = "") -> str:
    environment = {k: v for k, v in os.environ.items() if k != "KCORAL_TOKEN"}
    script = f"{before}\n{shlex.quote(sys.executable)} client.py"
    done = subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=directory, env={**environment, "URL": url},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


def test_the_readme_token_block_starts_a_server_that_serves_only_the_token_it_exports(
    tmp_path: Path,
) -> None:
    make, serve, export = token_block()
    subprocess.run(["bash", "-e", "-c", make], cwd=tmp_path, check=True, timeout=60)
    token_file = tmp_path / "client.token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    words = shlex.split(serve)
    assert words[:2] == ["kcoral", "server"], serve
    port = words.index("--port")
    args = words[2:port] + words[port + 2 :]
    server = start_server(
        tmp_path, [*args, "--disk-cache-dir", str(tmp_path / "cache")], defaults=False
    )
    try:
        (tmp_path / "client.py").write_text(CLIENT, encoding="utf-8")
        assert client_answer(tmp_path, server.url, export) == "1"
        assert client_answer(tmp_path, server.url) == "401"
    finally:
        server.stop()
