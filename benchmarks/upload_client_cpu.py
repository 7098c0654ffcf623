"""The client's CPU per upload, each part against a baseline measured in the same run, on a
local CPU server it starts (``upload_streaming.start_server``), alternating blocks (each
first in turn), fresh random bytes each upload (so every blob is missing on the server):

1. A folder of ``--files`` files of ``--file-bytes`` each through ``upload_folder`` and
   ``execute``: small files keeping the bytes they were hashed from (now) against every
   file read again as it is sent (``KEPT_TOTAL_BYTES = 0``: the path of 111c2ff).
2. A program with a 9 MiB blob, wall time of its ``execute``: the server's request limit
   kept by the client (now) against asked before each large attempt (the kept limit
   forgotten before each execute: the path of 111c2ff, CLIENT_API §2.1 step 11).
3. A 64 MiB body over a 16 MiB server limit on plain HTTP: refused from the kept limit
   (nothing sent) against sent without the question, stopped by the server's early 413
   (``kcoral.connection.early_answer``): wall time per refusal.

Prints the medians and the ratio now / baseline; client CPU is ``time.process_time`` (the
server is another process).

    python benchmarks/upload_client_cpu.py [--files 200] [--file-bytes 512] [--uploads 20]
        [--blocks 6]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from upload_streaming import start_server

from kcoral import Client, Program, local_folder
from kcoral.connection import request_limit
from kcoral.connection.request_limit import KnownLimit
from kcoral.errors import KCoralError

_SIZE = "def size(b):\n    return len(b)\n"


def alternated(
    name: str, unit: str, baseline: Callable[[], float], now: Callable[[], float], blocks: int
) -> None:
    """Median of ``blocks`` measures of each, alternating which goes first; one line."""
    measured: dict[str, list[float]] = {"baseline": [], "now": []}
    runs = {"baseline": baseline, "now": now}
    for block in range(blocks):
        order = ["baseline", "now"] if block % 2 else ["now", "baseline"]
        for which in order:
            measured[which].append(runs[which]())
    before, after = (statistics.median(measured[which]) for which in ("baseline", "now"))
    print(
        f"{name}: baseline {before:.2f} {unit}, now {after:.2f} {unit}, ratio {after / before:.3f}"
    )


def folder_uploads(
    url: str, scratch: str, files: int, size: int, uploads: int
) -> Callable[[bool], float]:
    folder = Path(tempfile.mkdtemp(dir=scratch))
    client = Client(url)
    kept_total = local_folder.KEPT_TOTAL_BYTES

    def run(keep: bool) -> float:
        local_folder.KEPT_TOTAL_BYTES = kept_total if keep else 0
        spent = 0.0
        for _ in range(uploads):
            for index in range(files):
                (folder / f"f{index:04d}").write_bytes(os.urandom(size))
            started = time.process_time()
            program = Program()
            program.upload_folder(folder, path="in")
            module = program.upload(kind="module", source="def f():\n    return 1\n")
            program.return_(
                key="x", value=program.run(fn=program.get_function(module=module, name="f"))
            )
            client.execute(program)
            spent += time.process_time() - started
        return spent / uploads * 1e3

    return run


def large_blob_uploads(url: str, uploads: int) -> Callable[[bool], float]:
    client = Client(url)

    def run(keep: bool) -> float:
        spent = 0.0
        for _ in range(uploads):
            program = sized_program(os.urandom(9 << 20))
            if not keep:
                client._request_limit = KnownLimit()  # asked afresh, as before
            started = time.perf_counter()
            client.execute(program)
            spent += time.perf_counter() - started
        return spent / uploads * 1e3

    return run


def refusals(url: str, uploads: int) -> Callable[[bool], float]:
    client = Client(url)
    data = os.urandom(64 << 20)
    programs = [sized_program(data[index:]) for index in range(uploads)]  # new blobs each

    def run(ask: bool) -> float:
        request_limit.ASK_FROM_BYTES = (8 << 20) if ask else 1 << 62
        started = time.perf_counter()
        for program in programs:
            try:
                client.execute(program)
            except KCoralError as exc:
                assert exc.status_code == 413, exc
        request_limit.ASK_FROM_BYTES = 8 << 20
        return (time.perf_counter() - started) / uploads * 1e3

    return run


def sized_program(data: bytes) -> Program:
    program = Program()
    blob = program.upload(kind="bytes", value=data)
    module = program.upload(kind="module", source=_SIZE)
    function = program.get_function(module=module, name="size")
    program.return_(key="n", value=program.run(fn=function, args=[blob]))
    return program


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--file-bytes", type=int, default=512)
    parser.add_argument("--uploads", type=int, default=20)
    parser.add_argument("--blocks", type=int, default=6)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        server, url = start_server(scratch, max_request="16M")
        try:
            folder = folder_uploads(
                url, scratch, options.files, options.file_bytes, options.uploads
            )
            name = f"{options.files} x {options.file_bytes} B folder, client CPU per upload"
            alternated(name, "ms", lambda: folder(False), lambda: folder(True), options.blocks)
            large = large_blob_uploads(url, options.uploads)
            name = "9 MiB blob, wall per execute"
            alternated(name, "ms", lambda: large(False), lambda: large(True), options.blocks)
            refused = refusals(url, max(2, options.uploads // 4))
            name = "64 MiB body over a 16 MiB limit, wall per refusal (baseline: early 413)"
            alternated(name, "ms", lambda: refused(False), lambda: refused(True), options.blocks)
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
