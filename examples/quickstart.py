"""Start a local CPU `kcoral server`, run a short program on it, print the results.

Run: python examples/quickstart.py            (starts and stops its own server)
     python examples/quickstart.py --url URL  (uses a server that is already running)
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

import kcoral

SOURCE = """
import numpy as np

def scale(x, factor):
    print(f"scaling {tuple(x.shape)} by {factor}")
    return x * factor

def describe(data):
    return {"bytes": len(data), "text": data.decode()}
"""


@contextlib.contextmanager
def local_server() -> Iterator[str]:
    """`kcoral server --device cpu` on a free port, stopped (SIGTERM, graceful) at the end."""
    with tempfile.TemporaryDirectory(prefix="kcoral-quickstart-") as tmp:
        ready = Path(tmp) / "url"
        command = [
            sys.executable, "-m", "kcoral", "server", "--device", "cpu", "--port", "0",
            "--num-workers", "2", "--sandbox", "none", "--log-dir", "",
            "--disk-cache-dir", str(Path(tmp) / "cache"), "--ready-file", str(ready),
        ]  # fmt: skip
        print("$", " ".join(command[1:]).replace("-m kcoral", "kcoral", 1), flush=True)
        server = subprocess.Popen(command)
        try:
            deadline = time.monotonic() + 60
            while not ready.exists() or not ready.read_text().strip():
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the server did not start")
                time.sleep(0.05)
            yield ready.read_text().strip()
        finally:
            server.terminate()
            server.wait(30)


def run(url: str) -> None:
    program = kcoral.Program()
    module = program.upload(kind="module", source=SOURCE)
    scale = program.get_function(module=module, name="scale")
    describe = program.get_function(module=module, name="describe", cpu_only=True)
    x = program.upload(kind="tensor", value=np.arange(6, dtype=np.float32).reshape(2, 3))
    data = program.upload(kind="bytes", value=b"hello from the client")
    program.return_(key="scaled", value=program.run(fn=scale, args=[x, 2.5]))
    program.return_(key="described", value=program.run(fn=describe, args=[data]))

    with kcoral.Client(url) as client:
        print("server:", client.health()["status"], url)
        result = client.execute(program, timeout_seconds=60)
    print("status:", result.status, f"({result.elapsed_ms:.1f} ms on the worker)")
    print("stdout:", result.stdout.strip())
    print("scaled:\n", result["scaled"])
    print("described:", result["described"])
    assert result.completed, result.error
    assert np.array_equal(result["scaled"], np.arange(6, dtype=np.float32).reshape(2, 3) * 2.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", help="use this server instead of starting one")
    url = parser.parse_args().url
    if url:
        run(url)
        return
    with local_server() as started:
        run(started)


if __name__ == "__main__":
    main()
