"""Many small files sent to a worker (``kcoral run --send DIR``, ``Program.upload_folder``):
where the time goes, each part against a baseline measured in the same run.

1. Front-end: a large body's blob hashes checked in the executor, one task per blob (the
   old path, written out here) against ``offload.hash_tasks`` (tasks of about 1 MiB); the
   same for a few large blobs, which must stay as parallel as before.
2. Worker: ``kcoral run``'s ``unpack_inputs`` writing the files into a new directory on the
   workspace filesystem (where sandbox directories and workspaces live: ``TMPDIR``), into
   one made right after as many files were deleted there (the server removes a workspace
   after each program), and on tmpfs (``/dev/shm``, the sandbox's ``/tmp``). Prints the
   filesystem and whether it keeps a journal: ext4 without one scans every recently
   deleted inode of a block group for each file it creates (``recently_deleted`` in the
   kernel's ``find_inode_bit``), a cost no user-space change removes.

    python benchmarks/send_files.py [--files 20000] [--per-directory 200] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from kcoral_server.front_door.app import EXECUTOR_THREADS
from kcoral_server.front_door.offload import hash_tasks

from kcoral.protocol.request import verify_blob_hashes
from kcoral.run.worker_side import pack_inputs, unpack_inputs


def _blobs(count: int, size: int) -> dict[str, memoryview]:
    blobs = {}
    for index in range(count):
        data = index.to_bytes(8, "big") * (size // 8 or 1)
        blobs[hashlib.sha256(data).hexdigest()] = memoryview(data)
    return blobs


async def _verify(blobs: dict[str, memoryview], executor: ThreadPoolExecutor, old: bool) -> float:
    loop = asyncio.get_running_loop()
    tasks = [{digest: data} for digest, data in blobs.items()] if old else hash_tasks(blobs)
    started = time.perf_counter()
    await asyncio.gather(
        *(loop.run_in_executor(executor, verify_blob_hashes, task) for task in tasks)
    )
    return time.perf_counter() - started


def front_end(files: int, rounds: int) -> None:
    cases = {
        f"{files} blobs of 40 B": _blobs(files, 40),
        "8 blobs of 16 MiB": _blobs(8, 16 << 20),
    }
    with ThreadPoolExecutor(EXECUTOR_THREADS) as executor:
        for title, blobs in cases.items():
            times: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(rounds):  # alternating, so both see the same machine
                for old in (True, False):
                    times[old].append(asyncio.run(_verify(blobs, executor, old)))
            base, head = statistics.median(times[True]), statistics.median(times[False])
            print(
                f"front-end hashing, {title}: a task per blob {base * 1000:.1f} ms -> "
                f"{len(hash_tasks(blobs))} task(s) {head * 1000:.1f} ms ({base / head:.1f}x)"
            )


def _filesystem(path: str) -> str:
    """Type and journal of the filesystem holding ``path`` (from /proc/self/mountinfo)."""
    best: tuple[str, str, str] = ("", "?", "?")
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            mount_point = fields[4]
            rest = fields[fields.index("-") + 1 :]
            inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
            if inside and len(mount_point) >= len(best[0]):
                best = (mount_point, rest[0], rest[1])
    _, kind, source = best
    if kind != "ext4":
        return kind
    device = os.path.basename(source)
    journal = os.path.isdir(f"/proc/fs/jbd2/{device}-8")
    return f"ext4 on {source}, {'with' if journal else 'without'} a journal"


def _tree(files: int, per_directory: int) -> bytes:
    entries = [
        (f"d{index // per_directory}/f{index % per_directory}.txt", b"%d\n" % index, False)
        for index in range(files)
    ]
    return pack_inputs(sorted(entries))


def _place(blob: bytes, root: str, before: Callable[[str], None] | None = None) -> float:
    directory = tempfile.mkdtemp(prefix="kcoral-send-files-", dir=root)
    try:
        if before is not None:
            before(directory)
        work = os.path.join(directory, "work")
        os.mkdir(work, 0o700)
        started = time.perf_counter()
        unpack_inputs(blob, work)
        return time.perf_counter() - started
    finally:
        subprocess.run(["rm", "-rf", directory], check=True)  # rmtree recurses per level


def worker(files: int, per_directory: int, rounds: int) -> None:
    blob = _tree(files, per_directory)
    disk = tempfile.gettempdir()

    def after_deleting(directory: str) -> None:
        # as many files made and deleted here first, as a removed workspace leaves them
        old = os.path.join(directory, "old")
        os.mkdir(old, 0o700)
        unpack_inputs(blob, old)
        subprocess.run(["rm", "-rf", old], check=True)

    print(f"workspace filesystem {disk}: {_filesystem(disk)}; tmpfs /dev/shm")
    results: dict[str, list[float]] = {"tmpfs": [], "disk": [], "disk after deleting": []}
    for _ in range(rounds):
        results["tmpfs"].append(_place(blob, "/dev/shm"))
        results["disk"].append(_place(blob, disk))
        results["disk after deleting"].append(_place(blob, disk, after_deleting))
    tmpfs = statistics.median(results["tmpfs"])
    for title, times in results.items():
        median = statistics.median(times)
        print(
            f"worker placing {files} files ({per_directory} a directory), {title}: "
            f"{median:.2f} s, {median / files * 1e6:.0f} us a file ({median / tmpfs:.1f}x tmpfs)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--per-directory", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    options = parser.parse_args()
    front_end(options.files, options.rounds)
    worker(options.files, options.per_directory, options.rounds)


if __name__ == "__main__":
    main()
