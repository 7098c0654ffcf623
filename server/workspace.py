"""Per-request workspace and output capture files (SERVER.md §7, §9).

The front-end creates both and reads the capture files itself, so the output of a worker that
crashed or was killed is still available (for the response or the ``output_tail`` log field).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

OUTPUT_TAIL_BYTES = 4096


@dataclass(frozen=True)
class CapturedOutput:
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool


NO_OUTPUT = CapturedOutput("", "", False, False)


class Workspace:
    """A private ``kcoral-program-*`` directory plus the request's capture files."""

    def __init__(self, path: Path, stdout_path: Path | None, stderr_path: Path | None) -> None:
        self.path = path
        self.stdout_path = stdout_path
        self.stderr_path = stderr_path

    @classmethod
    def create(cls, output_dir: Path | None, capture_name: str | None) -> Workspace:
        """Make the workspace (mode 0700) and, when ``capture_name`` is given, empty capture
        files ``<output_dir>/<capture_name>.out`` / ``.err`` (mode 0600)."""
        path = Path(tempfile.mkdtemp(prefix="kcoral-program-"))
        stdout_path = stderr_path = None
        if capture_name is not None:
            directory = Path(output_dir) if output_dir is not None else path.parent
            directory.mkdir(parents=True, exist_ok=True)
            stdout_path = directory / f"{capture_name}.out"
            stderr_path = directory / f"{capture_name}.err"
            for capture in (stdout_path, stderr_path):
                fd = os.open(capture, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.close(fd)
        return cls(path, stdout_path, stderr_path)

    def read_output(self, limit: int) -> CapturedOutput:
        """First ``limit`` bytes of each stream, UTF-8 with replacement (blocking: run it in
        the executor for big limits)."""
        if self.stdout_path is None or limit <= 0:
            return NO_OUTPUT
        out, out_more = _read_head(self.stdout_path, limit)
        err, err_more = _read_head(self.stderr_path, limit)
        return CapturedOutput(out, err, out_more, err_more)

    def output_tail(self) -> dict[str, str] | None:
        """Last 4096 bytes of each stream, for the log after a timeout or crash."""
        if self.stdout_path is None:
            return None
        return {
            "stdout": _read_tail(self.stdout_path, OUTPUT_TAIL_BYTES),
            "stderr": _read_tail(self.stderr_path, OUTPUT_TAIL_BYTES),
        }

    def output_size(self) -> int:
        """Bytes in the capture files so far (0 without capture)."""
        total = 0
        for path in (self.stdout_path, self.stderr_path):
            if path is not None:
                try:
                    total += os.stat(path).st_size
                except OSError:
                    pass
        return total

    def remove(self) -> None:
        """Remove the workspace in every case; capture files stay (they belong to the log)."""
        shutil.rmtree(self.path, ignore_errors=True)
        if self.path.exists():
            # A program may have removed its own permissions; restore them and retry.
            for root, dirs, _files in os.walk(self.path):
                for name in dirs:
                    try:
                        os.chmod(os.path.join(root, name), 0o700)
                    except OSError:
                        pass
            shutil.rmtree(self.path, ignore_errors=True)


def _read_head(path: Path | None, limit: int) -> tuple[str, bool]:
    if path is None:
        return "", False
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError:
        return "", False
    return data[:limit].decode("utf-8", errors="replace"), len(data) > limit


def _read_tail(path: Path | None, count: int) -> str:
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - count))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
