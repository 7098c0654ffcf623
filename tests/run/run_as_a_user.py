"""`kcoral run` as a user runs it: a real server started as the README starts one, with a
token file, and the real command line in a subprocess with KCORAL_URL and KCORAL_TOKEN
exported (a module name unique across the test tree, so plain ``import`` finds it)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from server_process import running_server


@dataclass(frozen=True)
class ServerWithAToken:
    url: str
    token: str


@contextlib.contextmanager
def server_with_a_token(directory: Path, args: Sequence[str] = ()) -> Iterator[ServerWithAToken]:
    """A CPU server whose clients need the token in ``directory``'s client.token (0600)."""
    token = "a-token-for-this-test-only"
    token_file = directory / "client.token"
    token_file.write_text(token + "\n", encoding="utf-8")
    token_file.chmod(0o600)
    with running_server(directory, ["--auth-token-file", str(token_file), *args]) as server:
        yield ServerWithAToken(server.url, token)


def kcoral_run(
    server: ServerWithAToken,
    *argv: str,
    cwd: Path | None = None,
    launcher: Sequence[str] = ("-m", "kcoral"),
) -> subprocess.CompletedProcess[str]:
    """`kcoral run ARGV` typed in ``cwd``, its stdin empty; what it wrote and its status.
    ``launcher``: Python's arguments before ``run`` (a ``-c`` script that watches the CLI)."""
    env = {**os.environ, "KCORAL_URL": server.url, "KCORAL_TOKEN": server.token}
    return subprocess.run(
        [sys.executable, *launcher, "run", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        timeout=100,
    )
