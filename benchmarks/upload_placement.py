"""How the worker places a program's file uploads: the UploadWriter (one DirectoryCursor
across consecutive uploads) against the per-file walk from the workspace it replaced (the
baseline, written out here), in the same run on the same trees. Reports opens (counted
through the ``open`` audit event) and the wall-time ratio.

    python benchmarks/upload_placement.py [--depth 2000] [--wide 2000x20]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from kcoral_server.worker.files import UploadWriter

from kcoral.protocol.nofollow import closing_fd, open_beneath

_opens = {"count": 0}


def _count(event: str, _args: tuple) -> None:
    if event == "open":
        _opens["count"] += 1


def per_file_walk(workspace_fd: int, path: str, data: memoryview) -> None:
    """The baseline: every level opened from the workspace for each file."""
    *parents, name = path.split("/")
    with closing_fd(open_beneath(workspace_fd, parents, create_mode=0o700)) as parent:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with closing_fd(os.open(name, flags, 0o600, dir_fd=parent)) as fd:
            os.write(fd, data)


def place(paths: list[str], how: str) -> tuple[int, float]:
    data = memoryview(b"x")
    top = tempfile.mkdtemp(prefix="kcoral-placement-")
    try:
        workspace_fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
        writer = UploadWriter(workspace_fd) if how == "writer" else None
        write: Callable[[str], None]
        if writer is not None:
            write = lambda path: writer.write(path, data)  # noqa: E731
        else:
            write = lambda path: per_file_walk(workspace_fd, path, data)  # noqa: E731
        _opens["count"] = 0
        started = time.perf_counter()
        for path in paths:
            write(path)
        elapsed = time.perf_counter() - started
        opens = _opens["count"]
        if writer is not None:
            writer.close()
        os.close(workspace_fd)
    finally:
        subprocess.run(["rm", "-rf", top], check=True)  # shutil.rmtree recurses per level
    return opens, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=2000, help="chain: a file at each level")
    parser.add_argument("--wide", default="2000x20", help="FILESxLEVELS: files spread over levels")
    options = parser.parse_args()
    files, levels = (int(n) for n in options.wide.split("x"))
    trees = {
        f"chain of {options.depth} levels, a file at each": [
            "up/" + "d/" * level + "f" for level in range(options.depth)
        ],
        f"{files} files over {levels} levels": sorted(
            "up/" + "".join(f"l{k}/" for k in range(i % levels + 1)) + f"f{i}" for i in range(files)
        ),
    }
    sys.addaudithook(_count)
    for title, paths in trees.items():
        base_opens, base_time = place(paths, "baseline")
        new_opens, new_time = place(paths, "writer")
        print(
            f"{title}: opens {base_opens} -> {new_opens}; "
            f"wall {base_time:.3f} s -> {new_time:.3f} s ({base_time / new_time:.1f}x)"
        )


if __name__ == "__main__":
    main()
