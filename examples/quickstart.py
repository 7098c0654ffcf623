"""Start a local CPU `kcoral server`, run a short program on it, print the results.

Run: python examples/quickstart.py               (starts and stops its own server)
     python examples/quickstart.py --server-log  (the same, showing the server's log lines)
     python examples/quickstart.py --url URL     (uses a server that is already running;
                                                  its token, if it needs one: KCORAL_TOKEN)

The server's own log (its event lines, its start and shutdown messages) goes to a file next
to its cache, not to this terminal, and is printed only when the server fails to start;
``--server-log`` shows it here as it happens.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

import kcoral
from kcoral.connection.server_address import server_url

SOURCE = """
import numpy as np

def scale(x, factor):
    print(f"scaling {tuple(x.shape)} by {factor}")
    return x * factor

def describe(data):
    return {"bytes": len(data), "text": data.decode()}
"""


@contextlib.contextmanager
def local_server(token: str, show_log: bool = False) -> Iterator[str]:
    """`kcoral server --device cpu` on a free port with its safe defaults (the sandbox where
    bubblewrap runs, a token: every local process and web page can reach a loopback port),
    stopped (SIGTERM, graceful) at the end; its log lines go to this terminal only with
    ``show_log``."""
    with tempfile.TemporaryDirectory(prefix="kcoral-quickstart-") as tmp:
        ready = Path(tmp) / "url"
        command = [
            sys.executable, "-m", "kcoral", "server", "--device", "cpu", "--port", "0",
            "--num-workers", "1", "--log-dir", "",
            "--disk-cache-dir", str(Path(tmp) / "cache"), "--ready-file", str(ready),
        ]  # fmt: skip
        shown = shlex.join(command[1:]).replace("-m kcoral", "kcoral", 1)
        print("$ KCORAL_AUTH_TOKEN=<a fresh token>", shown, flush=True)
        log_path = Path(tmp) / "server.log"
        # The token goes in the environment, never on the command line (which every local
        # user can read in /proc).
        environment = {**os.environ, "KCORAL_AUTH_TOKEN": token}
        with open(log_path, "wb") as log:
            server = subprocess.Popen(command, stderr=None if show_log else log, env=environment)
        try:
            deadline = time.monotonic() + 60
            while not ready.exists() or not ready.read_text().strip():
                if server.poll() is not None or time.monotonic() > deadline:
                    sys.stderr.write(log_path.read_text(errors="replace")[-4000:])
                    raise SystemExit("the server did not start (its log is above)")
                time.sleep(0.05)
            yield ready.read_text().strip()
        finally:
            server.terminate()
            server.wait(30)


def run(url: str, token: str | None) -> None:
    program = kcoral.Program()
    module = program.upload(kind="module", source=SOURCE)
    scale = program.get_function(module=module, name="scale")
    describe = program.get_function(module=module, name="describe", cpu_only=True)
    x = program.upload(kind="tensor", value=np.arange(6, dtype=np.float32).reshape(2, 3))
    data = program.upload(kind="bytes", value=b"hello from the client")
    program.return_(key="scaled", value=program.run(fn=scale, args=[x, 2.5]))
    program.return_(key="described", value=program.run(fn=describe, args=[data]))

    with connect(url, token) as client:
        print("server:", client.health()["status"], url)
        result = client.execute(program, timeout_seconds=60)
        # Each program gets a fresh worker. A server just started answers before its workers'
        # launcher has imported torch, so the first program's worker may import it itself
        # (seconds); the same program again shows what a program costs once it has. One
        # worker seat: its next worker waits for that import, where a second seat's first
        # worker, forked before it as well, imported torch again for the second program.
        again = client.execute(program, timeout_seconds=60)
    print("status:", result.status, f"({result.elapsed_ms:.1f} ms on the worker)")
    print("again: ", again.status, f"({again.elapsed_ms:.1f} ms on the worker)")
    print("stdout:", result.stdout.strip())
    print("scaled:\n", result["scaled"])
    print("described:", result["described"])
    assert result.completed, result.error
    assert np.array_equal(result["scaled"], np.arange(6, dtype=np.float32).reshape(2, 3) * 2.5)


def connect(url: str, token: str | None) -> kcoral.Client:
    """A client for ``url``; a KCORAL_TOKEN it cannot send (one pasted as 'Bearer ...') ends
    the script in the client's one line instead of its traceback."""
    try:
        return kcoral.Client(url, token=token)
    except ValueError as error:
        raise SystemExit(str(error)) from None


def server_address(text: str) -> str:
    """``--url`` by the client's address rule, refused by argparse in its words."""
    try:
        return server_url(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def refusal(url: str, error: Exception) -> str:
    """One line for a server that refused the program or could not be reached (a traceback
    of the client's frames says no more)."""
    if isinstance(error, kcoral.KCoralError) and error.status_code == 401:
        return str(error)  # it names the server and where a token comes from
    if isinstance(error, kcoral.KCoralError):
        return f"{url} answered {error}"
    return str(error)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--url", type=server_address, help="use this server instead of starting one"
    )
    parser.add_argument(
        "--server-log", action="store_true", help="show the started server's log lines here"
    )
    args = parser.parse_args()
    if args.url:
        try:
            run(args.url, None)  # its token, if it needs one: KCORAL_TOKEN
        except (kcoral.KCoralError, kcoral.TransportError) as error:
            raise SystemExit(refusal(args.url, error)) from None
        return
    token = secrets.token_urlsafe(32)
    with local_server(token, show_log=args.server_log) as started:
        run(started, token)


if __name__ == "__main__":
    main()
