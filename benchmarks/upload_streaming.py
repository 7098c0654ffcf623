"""Request bodies read from disk as they are sent (``upload_folder``'s ``FileBlob``), each
part against a baseline measured in the same run, on a local CPU server it starts:

1. Small programs: round trips of a one-upload program through ``HttpTransport`` as it is
   against its request path before bodies could hold streamed parts (written out here),
   alternating blocks (each first in turn); prints microseconds per trip and the ratio (it
   must stay ~1.0).
2. A folder of ``--folder-mib`` MiB in ``--files`` files, executed (every blob missing on
   the server: fresh random bytes each round) from its bytes in memory (``upload_file``,
   what ``upload_folder`` held before) against ``upload_folder``'s files read as sent;
   prints seconds, and the client's peak Python allocation while building and sending
   (``tracemalloc``), for each.

    python benchmarks/upload_streaming.py [--trips 300] [--blocks 6] [--folder-mib 256]
        [--files 4] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from kcoral import Client, Program
from kcoral.connection.http import SMALL_BODY_BYTES, HttpTransport
from kcoral.connection.transport import Request, Response


class BeforeStreaming(HttpTransport):
    """``handle_request`` as it was: a small body joined as it is, the rest given as is."""

    def handle_request(self, request: Request) -> Response:
        chunks = request.chunks
        if chunks is not None and len(chunks) > 1 and request.length <= SMALL_BODY_BYTES:
            chunks = (b"".join(chunks),)  # type: ignore[arg-type]
        return self.request(
            request.method,
            request.path,
            body=chunks,  # type: ignore[arg-type]
            content_length=request.length,
            headers=request.headers,
            read_timeout=request.read_timeout,
        )


def start_server(directory: str, max_request: str = "2G") -> tuple[subprocess.Popen[bytes], str]:
    ready = Path(directory, "ready")
    command = [sys.executable, "-m", "kcoral", "server", "--port", "0", "--device", "cpu"]
    command += ["--sandbox", "none", "--num-workers", "1", "--max-requests-per-worker", "0"]
    command += ["--max-request-bytes", max_request, "--ready-file", str(ready), "--log-dir", ""]
    command += ["--disk-cache-dir", ""]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not ready.exists():
        if server.poll() is not None:
            raise SystemExit("the server did not start")
        time.sleep(0.05)
    return server, ready.read_text().strip()


def small_trips(url: str, trips: int, blocks: int) -> None:
    program = Program()
    module = program.upload(kind="module", source="def f(x):\n    return x\n")
    program.return_(
        key="x", value=program.run(fn=program.get_function(module=module, name="f"), args=[1])
    )
    headers = Client(url).headers  # the client's own (user agent, identity encoding)
    clients = {}
    for name, kind in (("before", BeforeStreaming), ("now", HttpTransport)):
        transport = kind(url, headers=headers, connect_timeout_seconds=10)
        client = Client(url, transport=transport)
        client.execute(program)  # warm: connection, worker, caches
        clients[name] = client
    per_trip: dict[str, list[float]] = {"before": [], "now": []}
    for block in range(blocks):
        order = list(clients.items())
        for name, client in order if block % 2 else reversed(order):  # neither always first
            started = time.perf_counter()
            for _ in range(trips):
                client.execute(program)
            per_trip[name].append((time.perf_counter() - started) / trips * 1e6)
    before, now = (statistics.median(per_trip[n]) for n in ("before", "now"))
    ratio = now / before
    print(f"small program round trip: before {before:.0f} us, now {now:.0f} us, ratio {ratio:.3f}")


def folder_rounds(url: str, mib: int, files: int, rounds: int, scratch: str) -> None:
    results: dict[str, list[tuple[float, int]]] = {"in memory": [], "from disk": []}
    for _ in range(rounds):
        for name in results:
            folder = Path(tempfile.mkdtemp(dir=scratch))
            for index in range(files):
                (folder / f"f{index}").write_bytes(os.urandom((mib << 20) // files))
            tracemalloc.start()
            started = time.perf_counter()
            program = Program()
            if name == "in memory":
                for path in sorted(folder.iterdir()):
                    program.upload_file(blob=path.read_bytes(), path=f"in/{path.name}")
            else:
                program.upload_folder(folder, path="in")
            with Client(url) as client:
                client.execute(program, timeout_seconds=600)
            seconds = time.perf_counter() - started
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            results[name].append((seconds, peak))
            del program
            for path in folder.iterdir():
                path.unlink()
            folder.rmdir()
    for name, measured in results.items():
        seconds = statistics.median(s for s, _ in measured)
        peak = max(p for _, p in measured) / (1 << 20)
        print(f"{mib} MiB folder, {name}: {seconds:.2f} s, client peak allocation {peak:.1f} MiB")
    ratio = statistics.median(s for s, _ in results["from disk"]) / statistics.median(
        s for s, _ in results["in memory"]
    )
    print(f"  time ratio from disk / in memory {ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trips", type=int, default=300)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--folder-mib", type=int, default=256)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        server, url = start_server(scratch)
        try:
            small_trips(url, options.trips, options.blocks)
            folder_rounds(url, options.folder_mib, options.files, options.rounds, scratch)
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
