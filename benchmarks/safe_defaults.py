"""What the safe defaults cost a notebook cell (issue 16): a trivial program on a fresh worker
per request (the embedded server's setting), requests spaced 100 ms apart.

    python benchmarks/safe_defaults.py [--requests N]

Compares the embedded server's flags before issue 16 (``--sandbox none``, no limits: the
fork server) with today's defaults (bubblewrap where it works, process and memory limits:
each seat's fork server runs inside its sandbox), and with the same defaults when every
worker is spawned (``KCORAL_WORKER_LAUNCH=spawn``, what a sandboxed worker cost before).
Prints medians and ratios against the first row; timings are information, never a test.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kcoral.protocol.multipart import encode_multipart

SOURCE = "def main():\n    return 1\n"
PROGRAM = {
    "instructions": [
        {"op": "upload", "id": "m", "kind": "module", "source": SOURCE},
        {"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": "main"},
        {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": []},
        {"op": "return", "key": "value", "value": {"$ref": "r"}},
    ]
}
BASE = ["--device", "cpu", "--log-dir", "", "--disk-cache-dir", ""]
CONFIGS = [
    ("before (none, no limits)", [*BASE, "--sandbox", "none", "--worker-process-limit", "0",
                                  "--worker-memory-limit-bytes", "0"], {}),
    ("defaults (sandbox, limits)", BASE, {}),
    ("defaults, spawned workers", BASE, {"KCORAL_WORKER_LAUNCH": "spawn"}),
]  # fmt: skip


def _post(url: str, body: bytes, content_type: str) -> None:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        connection.request("POST", "/execute", body, {"Content-Type": content_type})
        answer = connection.getresponse()
        answer.read()
        if answer.status != 200:
            raise RuntimeError(f"/execute answered {answer.status}")
    finally:
        connection.close()


def measure(args: list[str], env: dict[str, str], requests: int) -> tuple[float, str]:
    """Median milliseconds per trivial request, and the sandbox the server reported."""
    content_type, chunks, _ = encode_multipart(
        [("program", "application/json", json.dumps(PROGRAM).encode())]
    )
    body = b"".join(bytes(c) for c in chunks)
    with tempfile.TemporaryDirectory() as directory:
        ready = Path(directory) / "ready"
        command = [sys.executable, "-m", "kcoral", "server", "--port", "0"]
        command += ["--ready-file", str(ready), *args]
        process = subprocess.Popen(
            command, env={**os.environ, **env}, stderr=subprocess.DEVNULL, cwd=directory
        )
        try:
            while not ready.exists():
                if process.poll() is not None:
                    raise RuntimeError(f"server exited: {' '.join(args)}")
                time.sleep(0.05)
            url = ready.read_text().strip()
            for _ in range(3):  # warm-up: the seat's fork server starts on first use
                _post(url, body, content_type)
                time.sleep(0.3)
            times = []
            for _ in range(requests):
                started = time.perf_counter()
                _post(url, body, content_type)
                times.append((time.perf_counter() - started) * 1000.0)
                time.sleep(0.1)
            host, port = url.split("://", 1)[1].rsplit(":", 1)
            connection = http.client.HTTPConnection(host, int(port), timeout=30)
            connection.request("GET", "/v1/info")
            sandbox = json.loads(connection.getresponse().read()).get("sandbox", "?")
            connection.close()
        finally:
            process.terminate()
            process.wait(30)
    return statistics.median(times), sandbox


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30)
    options = parser.parse_args()
    first = None
    for name, args, env in CONFIGS:
        median, sandbox = measure(args, env, options.requests)
        first = first or median
        print(f"{name:28s} sandbox={sandbox:10s} {median:7.1f} ms  x{median / first:.2f}")


if __name__ == "__main__":
    main()
