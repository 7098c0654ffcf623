"""The embedded local KCoral server a kernel starts when no URL is configured.

``kcoral server --port 0 --ready-file F`` runs as a child of the kernel: it dies with the
kernel (``PR_SET_PDEATHSIG`` on Linux, plus an ``atexit`` stop) and is advertised in a small
JSON file in Jupyter's runtime directory (``kcoral-local-<kernel pid>.json``) so that the
Jupyter server extension can offer it. No IPython import.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

ADVERT_PREFIX = "kcoral-local-"


def runtime_dir() -> Path:
    """Jupyter's runtime directory (``JUPYTER_RUNTIME_DIR`` honoured)."""
    try:
        from jupyter_core.paths import jupyter_runtime_dir

        return Path(jupyter_runtime_dir())
    except ImportError:  # jupyter_core absent: the same default it would pick
        base = os.environ.get("JUPYTER_RUNTIME_DIR")
        return Path(base) if base else Path.home() / ".local/share/jupyter/runtime"


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: ask Linux to SIGTERM it when the kernel dies.
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class LocalServer:
    """One embedded server process; ``start`` is idempotent, ``stop`` too."""

    def __init__(self, extra_args: Sequence[str] = (), start_timeout: float = 120.0) -> None:
        self.extra_args = list(extra_args)
        self.start_timeout = start_timeout
        self.url: str | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.advert: Path | None = None
        self._directory: tempfile.TemporaryDirectory[str] | None = None
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> str:
        """Start (or reuse) the server and return its URL."""
        with self._lock:
            if self.running and self.url:
                return self.url
            self._cleanup()
            self._directory = tempfile.TemporaryDirectory(prefix="kcoral-local-")
            folder = Path(self._directory.name)
            ready = folder / "ready"
            log = folder / "server.log"
            command = [
                sys.executable,
                "-m",
                "kcoral",
                "server",
                "--port",
                "0",
                "--ready-file",
                str(ready),
                *self.extra_args,
            ]
            with open(log, "wb") as stderr:
                self.process = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                    cwd=folder,
                    preexec_fn=_die_with_parent if sys.platform == "linux" else None,
                )
            deadline = time.monotonic() + self.start_timeout
            while not ready.exists() or not ready.read_text(encoding="utf-8").strip():
                if self.process.poll() is not None or time.monotonic() > deadline:
                    tail = log.read_text(encoding="utf-8", errors="replace")[-2000:]
                    self._cleanup()
                    raise RuntimeError(f"the local KCoral server did not start:\n{tail}")
                time.sleep(0.05)
            self.url = ready.read_text(encoding="utf-8").strip()
            self._advertise()
            atexit.register(self.stop)
            return self.url

    def stop(self) -> bool:
        """Stop the server; True if one was running."""
        with self._lock:
            was_running = self.running
            self._cleanup()
            return was_running

    def log_tail(self, limit: int = 4000) -> str:
        if self._directory is None:
            return ""
        path = Path(self._directory.name) / "server.log"
        try:
            return path.read_text(encoding="utf-8", errors="replace")[-limit:]
        except OSError:
            return ""

    def _advertise(self) -> None:
        try:
            folder = runtime_dir()
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{ADVERT_PREFIX}{os.getpid()}.json"
            temporary = path.with_suffix(".tmp")
            assert self.process is not None
            temporary.write_text(
                json.dumps(
                    {
                        "url": self.url,
                        "pid": self.process.pid,
                        "kernel_pid": os.getpid(),
                        "started": time.time(),
                    }
                ),
                encoding="utf-8",
            )
            os.replace(temporary, path)
            self.advert = path
        except OSError:
            self.advert = None  # advertising is a convenience; the server still works

    def _cleanup(self) -> None:
        if self.advert is not None:
            self.advert.unlink(missing_ok=True)
            self.advert = None
        if self.process is not None:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(30)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(10)
            self.process = None
        if self._directory is not None:
            self._directory.cleanup()
            self._directory = None
        self.url = None


def advertised_servers() -> list[dict[str, object]]:
    """Embedded servers advertised by live kernels (stale files are ignored)."""
    found: list[dict[str, object]] = []
    try:
        paths = sorted(runtime_dir().glob(f"{ADVERT_PREFIX}*.json"))
    except OSError:
        return found
    for path in paths:
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            pid = int(record["pid"])
            os.kill(pid, 0)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(record.get("url"), str):
            found.append(record)
    return found
