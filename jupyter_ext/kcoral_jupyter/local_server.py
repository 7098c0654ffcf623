"""The embedded local KCoral server a kernel starts when no URL is configured.

``kcoral server --port 0 --ready-file F`` runs as a child of the kernel: it dies with the
kernel (``PR_SET_PDEATHSIG`` on Linux, plus an ``atexit`` stop) and is advertised in a small
JSON file in Jupyter's runtime directory (``kcoral-local-<kernel pid>.json``) so that the
Jupyter server extension can offer it. No IPython import.

Who can reach what: the server listens on loopback, where every local process and every web
page the user visits can send it requests. It is therefore never token-less (EXTENSIONS §6):
each start makes a fresh random token, handed to the child only through its environment
(``KCORAL_AUTH_TOKEN``, never its command line, which every local user can read in
``/proc``), kept by this object for the kernel's own client, and written only into the
advertisement, a 0600 file in the user's 0700 runtime directory, for the server extension.
A web page is refused by the server's Origin/Host checks as well. The user's remote
``KCORAL_TOKEN`` is not passed on to the child.
"""

from __future__ import annotations

import atexit
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from kcoral_jupyter.runtime_records import read_records, write_record

ADVERT_PREFIX = "kcoral-local-"
# Never inherited by the embedded server: the user's token for remote servers (tokens are
# per URL) and any server token of the kernel's environment (replaced by a fresh one).
NOT_INHERITED = ("KCORAL_TOKEN", "KCORAL_AUTH_TOKEN")


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
        self.token: str | None = None  # the running server's client token
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
            self.token = secrets.token_urlsafe(32)
            environment = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
            environment["KCORAL_AUTH_TOKEN"] = self.token
            with open(log, "wb") as stderr:
                self.process = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                    cwd=folder,
                    env=environment,
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

    @property
    def log_path(self) -> Path | None:
        """The running server's log file (its stderr: SERVER §12's messages and the event
        log's console lines), kept out of the notebook and the terminal so that cells
        show only what they print; ``%kcoral local log`` shows its end."""
        if self._directory is None:
            return None
        return Path(self._directory.name) / "server.log"

    def log_tail(self, lines: int) -> str:
        """The last ``lines`` lines of the server's log ('' when there is none)."""
        path = self.log_path
        if path is None or not path.exists():
            return ""
        text = path.read_text(encoding="utf-8", errors="replace")
        return "".join(text.splitlines(keepends=True)[-lines:])

    def stop(self) -> bool:
        """Stop the server; True if one was running."""
        with self._lock:
            was_running = self.running
            self._cleanup()
            return was_running

    def _advertise(self) -> None:
        """Write the advertisement (with the token) where only this user can read it."""
        assert self.process is not None
        record = {
            "url": self.url,
            "pid": self.process.pid,
            "kernel_pid": os.getpid(),
            "started": time.time(),
            "token": self.token,
        }
        # None: the panel will not list it; the kernel still uses it.
        self.advert = write_record(f"{ADVERT_PREFIX}{os.getpid()}.json", record)

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
        self.token = None


def advertised_servers() -> list[dict[str, object]]:
    """Embedded servers advertised by live kernels (stale files are ignored)."""
    return read_records(ADVERT_PREFIX, "pid")
