"""The embedded local KCoral server a kernel starts when no URL is configured.

``kcoral server --port 0 --ready-file F`` runs as a child of the kernel, in a session of its
own (Jupyter's interrupt, SIGINT to the kernel's process group, does not reach it). It dies
with the kernel: an ``atexit`` stop, and on Linux ``PR_SET_PDEATHSIG`` SIGKILL when the
kernel dies before that stop is done (running programs are not waited for). It is advertised
in a small JSON file in Jupyter's runtime directory (``kcoral-local-<kernel pid>.json``) so
that the Jupyter server extension can offer it. No IPython import.

Who can reach what: the server listens on loopback, where every local process and every web
page the user visits can send it requests. It is therefore never token-less (EXTENSIONS §6):
each start makes a fresh random token, handed to the child only through its environment
(``KCORAL_AUTH_TOKEN``, never its command line, which every local user can read in
``/proc``), kept by this object for the kernel's own client, and written only into the
advertisement, a 0600 file in the user's 0700 runtime directory, for the server extension.
A web page has no token: a page of another site is refused by the server's Origin and
fetch-metadata checks too (its scripts, images and frames included), and a DNS-rebinding
page (its requests carry its own host name and no ``Origin``) reaches only ``/health``
and ``/internal/worker-status``, which answer anyone by design (PROTOCOL §12, §13: status,
load and seat counts, versions; nothing of the user's). Every other route needs the
token.
The user's remote ``KCORAL_TOKEN`` is not passed on to the child.

A start that fails (bad ``KCoral.local_args``, a timeout, an exit) raises a two-line
``LocalServerStartError`` naming the arguments, the timeout and the log file, which is kept
until the next start or stop so that ``%kcoral local log`` shows it.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from kcoral_jupyter.cell_errors import LocalServerStartError
from kcoral_jupyter.runtime_records import read_records, write_record

ADVERT_PREFIX = "kcoral-local-"
# Never inherited by the embedded server: the user's token for remote servers (tokens are
# per URL) and any server token of the kernel's environment (replaced by a fresh one).
NOT_INHERITED = ("KCORAL_TOKEN", "KCORAL_AUTH_TOKEN")


#: how long ``stop`` lets the server's running programs and jobs finish (its graceful
#: shutdown, SERVER §12) before it kills it; an interrupt kills it at once
STOP_GRACE_SECONDS = 30


#: Put in front of the server's command (``python -c`` this, the kernel's pid, the command):
#: ask Linux to SIGKILL the server when the kernel dies, then exec it; the request survives
#: exec. Not SIGTERM: the server's graceful shutdown lets running programs finish (SERVER
#: §12), which for a kernel that died without stopping it (killed, out of memory, a forced
#: restart) meant running them on for nobody, up to their timeouts. Its launchers kill the
#: workers when it dies (SERVER §11). Not a ``preexec_fn``: that runs Python in the forked
#: child before exec, and in a kernel where a gRPC library is busy, gRPC's fork handler
#: left that child to die of SIGSEGV about one start in three.
_TIED_TO_KERNEL = """\
import os, sys
try:
    import ctypes, signal
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
except Exception:
    pass
if os.getppid() != int(sys.argv[1]):
    os._exit(1)  # the kernel died before the tie: nobody would stop this server
os.execv(sys.argv[2], sys.argv[2:])
"""


def _tied_to_kernel(command: list[str]) -> list[str]:
    if sys.platform != "linux":
        return command
    return [sys.executable, "-c", _TIED_TO_KERNEL, str(os.getpid()), *command]


def _folder_prefix() -> str:
    """``kcoral-local-<instance>-``: this kernel holds the instance's lock, so the folder of
    a kernel killed with SIGKILL (nothing ran to remove it) is removed by the next server to
    start with this temporary directory, as it removes a killed server's workspaces."""
    try:
        from kcoral_server.storage.workspace import LOCAL_SERVER_PREFIX, instance_prefix

        return instance_prefix(LOCAL_SERVER_PREFIX)
    except (ImportError, AttributeError, OSError):  # no flock, no fallocate: not Linux
        return "kcoral-local-"


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

    def configure(self, extra_args: Sequence[str], start_timeout: float) -> None:
        """The arguments and start timeout of the next start (a running server keeps its
        own until it is stopped): the settings as they are when a start is asked for."""
        with self._lock:
            self.extra_args = list(extra_args)
            self.start_timeout = start_timeout

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> str:
        """Start (or reuse) the server and return its URL."""
        with self._lock:
            if self.running and self.url:
                return self.url
            self._cleanup()
            self._directory = tempfile.TemporaryDirectory(prefix=_folder_prefix())
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
                    _tied_to_kernel(command),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                    cwd=folder,
                    env=environment,
                    # A session (and process group) of its own: Jupyter interrupts a kernel
                    # with SIGINT to the kernel's process group, which would shut the server
                    # down, and ipykernel's shutdown signals that group's processes until
                    # they are reaped, so the kernel outlived Jupyter's wait, was killed,
                    # and its exit hooks (this server's stop, a session's end) never ran.
                    start_new_session=True,
                )
            deadline = time.monotonic() + self.start_timeout
            while not ready.exists() or not ready.read_text(encoding="utf-8").strip():
                exited = self.process.poll() is not None
                if exited or time.monotonic() > deadline:
                    raise self._failed(exited)
                time.sleep(0.05)
            self.url = ready.read_text(encoding="utf-8").strip()
            self._advertise()
            atexit.register(self.stop)
            return self.url

    def _failed(self, exited: bool) -> LocalServerStartError:
        """Stop the half-started server, keep its log, and say why it did not start."""
        self._cleanup(keep_log=True)
        log = self.log_path
        last = ""
        if log is not None and log.exists():
            lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
            last = next((" ".join(line.split()) for line in reversed(lines) if line.strip()), "")
        how = f"did not start within {self.start_timeout:g} s"
        if exited:
            how = f"exited ({last[:200]})" if last else "exited"
        arguments = shlex.join(self.extra_args) or "none"
        return LocalServerStartError(
            f"the local KCoral server {how}; arguments: {arguments}; log: {log}",
            "fix %config KCoral.local_args (or KCoral.local_start_timeout, now "
            f"{self.start_timeout:g} s), then %kcoral local start; %kcoral local log shows the log",
        )

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

    def _cleanup(self, keep_log: bool = False) -> None:
        """Stop the process and forget it; ``keep_log``: leave its folder (the log of a
        failed start) until the next start or stop."""
        if self.advert is not None:
            self.advert.unlink(missing_ok=True)
            self.advert = None
        if self.process is not None:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(STOP_GRACE_SECONDS)
                except (subprocess.TimeoutExpired, KeyboardInterrupt):  # an interrupt: now
                    self.process.kill()
                    self.process.wait(10)
            self.process = None
        if self._directory is not None and not keep_log:
            self._directory.cleanup()
            self._directory = None
        self.url = None
        self.token = None


def advertised_servers() -> list[dict[str, object]]:
    """Embedded servers advertised by live kernels (stale files are ignored)."""
    return read_records(ADVERT_PREFIX, "pid")
