"""The fork server's own process: the loop that forks workers, the preload, the fork rule.

``main`` is ``python -m kcoral_server.processes.launcher``. It serves the control socket
(``serve``) until the front-end goes away, and in each forked child it returns to run the
worker (``forked_worker``); with ``--supervise`` it is a spawned worker's supervisor
instead (``spawn_supervisor``). The fork rule, the preload and the lifetimes are described
in the package docstring (``kcoral_server.processes.launcher``) and SERVER §1, §11.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import importlib
import importlib.util
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence

from kcoral_server.processes.launcher.family import Family, watch_parent
from kcoral_server.processes.launcher.finalizers import keep_preload_finalizers_from_exit
from kcoral_server.processes.launcher.forked_worker import (
    Child,
    become_worker,
    quick_exit,
    run_child,
    set_dumpable,
)
from kcoral_server.processes.launcher.huge_pages import collapse_heap
from kcoral_server.processes.launcher.spawn_supervisor import supervise
from kcoral_server.processes.launcher.wire import (
    ENTRY_MODULE,
    MAX_MESSAGE,
    PRELOADABLE,
    LaunchReply,
    LaunchRequest,
)
from kcoral_server.worker.reaper import become_subreaper

#: imported by the launcher before it forks anything (what every worker imports anyway)
PRELOADED = (
    "kcoral_server.worker.__main__",  # its file names the worker in sys.argv (run_child)
    "kcoral_server.worker.main",
    "kcoral_server.worker.engine",
    "kcoral.protocol.validate",
    "kcoral.protocol.values",
)
#: whether this fork server ran a trivial program's path before it froze its heap
#: (``warm_up.warm_up_for_forks``): its workers inherit what that path makes once
warmed_for_forks = False
#: how long the launcher must have had no request before it starts the preload
PRELOAD_IDLE_SECONDS = 0.2
#: ... or this long after it started at the latest, however busy (a seat replaced
#: back-to-back never leaves its launcher idle)
PRELOAD_LATEST_SECONDS = 2.0


def serve(
    control: socket.socket, parent: int | None = None, preload_names: Sequence[str] = ()
) -> Child | None:
    """The launcher loop; returns ``None`` in the launcher (exit) or a ``Child`` in a child.

    ``parent`` is the front-end's pid: the launcher kills its workers and exits when it dies.
    ``preload_names`` are imported once the launcher is idle (the package docstring).
    """
    for name in PRELOADED:
        __import__(name)
    from kcoral_server.worker.runtime import remember_installed_versions

    remember_installed_versions()  # what every worker reports at start, asked once
    freeze_heap()
    preloads = Preloads(preload_names)
    last_request = started = time.monotonic()
    become_subreaper()
    # Programs run as the same user in the same sandbox as their launcher: non-dumpable, it
    # cannot be ptraced or have its memory read or written by them (each child resets it).
    set_dumpable(False)
    alive, parent_fd = watch_parent(parent)
    if not alive:
        return None
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the select below
    # SIGTERM is for the workers: the server never signals its launcher (it ends when the
    # server hangs up), and one that "kill every process" (a plain `scancel`, `kill` of
    # the job's processes) ended died before reporting on its workers' descendants, so a
    # program killed with it read "worker cleanup was not confirmed" and the GPUs were
    # quarantined. Each forked worker takes SIGTERM's default back (become_worker), as the
    # spawn supervisor's command does through exec.
    signal.signal(signal.SIGTERM, lambda *_: None)
    family = Family()
    accepting = True
    # what every child gets on its descriptors 0, 1 and 2 (log_relay: never our log pipe)
    stdio = os.open(os.devnull, os.O_RDWR)
    try:
        while True:
            watched: list[socket.socket | int] = [wake_r]
            if accepting:
                watched.append(control)
            if parent_fd is not None:
                watched.append(parent_fd)
            timeout = family.poll_interval
            if preloads.pending and accepting:
                due = min(last_request + PRELOAD_IDLE_SECONDS, started + PRELOAD_LATEST_SECONDS)
                remaining = max(0.0, due - time.monotonic())
                timeout = remaining if timeout is None else min(timeout, remaining)
            readable, _w, _x = select.select(watched, [], [], timeout)
            if parent_fd is not None and parent_fd in readable:
                family.kill_all()  # the front-end died (SIGKILL): nothing may outlive it
                return None
            now = time.monotonic()
            idle = control not in readable and now - last_request >= PRELOAD_IDLE_SECONDS
            if preloads.pending and accepting and (idle or now - started >= PRELOAD_LATEST_SECONDS):
                preloads.run(family, control)
            if wake_r in readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 512)
            family.collect()
            if control in readable:
                try:
                    data, fds, _flags, _addr = socket.recv_fds(control, MAX_MESSAGE, 4)
                except OSError:
                    data, fds = b"", []
                last_request = time.monotonic()
                if data:
                    own = (wake_r, wake_w, stdio, *(() if parent_fd is None else (parent_fd,)))
                    child = _fork(control, data, fds, family, own, preloads, stdio)
                    if child is not None:
                        parent_fd = None  # closed in the child already
                        return child
                else:
                    accepting = False  # the front-end closed the socket: fork no more
            if not accepting and family.empty:
                if preloads.abandoned:  # as ``ExitOnHangup`` does if no worker outlives the import
                    os._exit(0)
                return None
    finally:
        family.close()
        if parent_fd is not None:
            with contextlib.suppress(OSError):
                os.close(parent_fd)


def _fork(
    control: socket.socket,
    data: bytes,
    fds: list[int],
    family: Family,
    launcher_fds: tuple[int, ...],
    preloads: Preloads,
    stdio: int | None = None,
) -> Child | None:
    try:
        request = LaunchRequest.decode(data)
        if len(fds) != request.descriptors:
            raise ValueError(f"expected {request.descriptors} descriptor(s), got {len(fds)}")
    except (ValueError, KeyError, TypeError) as exc:
        for fd in fds:
            os.close(fd)
        _reply(control, LaunchReply(error=f"bad launch request: {exc}"), [])
        return None
    if request.after_preload:
        preloads.run(family, control)  # a spare: no program waits for it
    if preloads.abandoned:  # the front-end hung up meanwhile: it takes no worker now
        for fd in fds:
            os.close(fd)
        return None
    hazards = fork_hazards()
    if hazards:
        for fd in fds:
            os.close(fd)
        message = refusal_message(hazards)
        print(f"kcoral launcher: {message}", file=sys.stderr, flush=True)
        _reply(control, LaunchReply(error=message, refused=True), [])
        return None
    worker_fd = fds[0]
    go = fds[1] if len(fds) == 2 else None
    status_r, status_w = os.pipe()
    launcher = os.getpid()
    try:
        pid = os.fork()
    except OSError as exc:
        for fd in (*fds, status_r, status_w):
            os.close(fd)
        _reply(control, LaunchReply(error=f"fork failed: {exc}"), [])
        return None
    if pid == 0:  # the worker
        return become_worker(
            Child(worker_fd, request.env, list(request.cgroups)),
            launcher=launcher,
            go=go,
            control=control,
            launcher_fds=(status_r, status_w, *launcher_fds),
            family=family,
            stdio=stdio,
        )
    for fd in fds:
        os.close(fd)
    family.workers[pid] = status_w
    _reply(control, LaunchReply(pid=pid, preloaded=tuple(preloads.loaded)), [status_r])
    os.close(status_r)
    return None


def _reply(control: socket.socket, reply: LaunchReply, fds: list[int]) -> None:
    with contextlib.suppress(OSError):
        socket.send_fds(control, [reply.encode()], fds)


# ---------------------------------------------------------------------- the fork rule


def fork_hazards() -> list[str]:
    """What breaks the fork rule right now (see the package docstring); empty: fork."""
    hazards = []
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    # is_initialized reads torch's flag; it neither initializes CUDA nor caches a count
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        hazards.append("CUDA is initialized")
    main = threading.main_thread()
    python = [thread.name for thread in threading.enumerate() if thread is not main]
    if python:
        hazards.append(f"Python thread(s) besides the main one: {', '.join(sorted(python))}")
    native = _other_native_threads()
    if native:
        hazards.append(f"native thread(s) besides the main one: {', '.join(native)}")
    return hazards


def _other_native_threads() -> list[str]:
    """``tid (name)`` of this process's threads other than the main one ([] if /proc cannot
    say)."""
    try:
        tids = os.listdir("/proc/self/task")
        # "<pid>/task/<tid>" as this /proc numbers them (a sandbox mounts its own)
        own = os.readlink("/proc/thread-self").rsplit("/", 1)[-1]
    except OSError:
        return []
    others = []
    for tid in sorted(tids, key=int):
        if tid == own:
            continue
        try:
            with open(f"/proc/self/task/{tid}/comm") as comm:
                name = comm.read().strip()
        except OSError:
            continue  # it ended meanwhile
        others.append(f"{tid} ({name})")
    return others


def refusal_message(hazards: Sequence[str]) -> str:
    """The error a launcher that breaks the fork rule answers with."""
    return (
        "the worker fork server refused to fork: "
        + "; ".join(hazards)
        + " (a fork now could deadlock the worker or break CUDA in it, SERVER §1;"
        " --worker-preload none turns the preload off if it caused this)"
    )


# ---------------------------------------------------------------------- the preload


class Preloads:
    """The modules a launcher imports once (``--preload``): those still to come, and those
    imported, which each fork's reply names."""

    def __init__(self, names: Sequence[str]) -> None:
        self.pending = list(names)
        self.loaded: list[str] = []
        #: the front-end hung up during the import (``ExitOnHangup``): no fork from now on
        self.abandoned = False

    def run(self, family: Family, control: socket.socket) -> None:
        """Import what is still to come (blocks; requests queue on the socket meanwhile).
        Workers that exit meanwhile are reaped and reported at once (``ReapDuringImport``):
        a cancel or a timeout waits for that report, and the import takes seconds. A
        front-end that hangs up meanwhile (the server stops) ends the launcher as soon as it
        has no worker left (``ExitOnHangup``), whether the import has ended or not."""
        if self.pending:
            reaper = ReapDuringImport(family)
            hangup = ExitOnHangup(control, reaper)
            with reaper, hangup:
                self.loaded = preload(self.pending)
            self.abandoned = hangup.hung_up  # this launcher forks nothing more
            self.pending = []


class ExitOnHangup:
    """While it is active, the control socket's end of file (the front-end closed or shut it
    down: the server is stopping) ends the launcher once its last worker's exit is reported,
    without waiting for the import. A stopping server used to wait for the whole import (30 s
    with 16 fake-GPU seats), its port bound meanwhile. The kernel signals the socket's events
    (``O_ASYNC``, ``SIGIO``). Nothing is raised into the import: an exception from a signal
    handler lands wherever the import is, and inside torch's C++ start-up calling back into
    Python that was ``terminate called after throwing ... error_already_set`` (the launcher
    aborted, its workers reported crashed), inside a weakref callback a printed traceback."""

    def __init__(self, control: socket.socket, reaper: ReapDuringImport) -> None:
        self.control = control
        self.reaper = reaper
        self.flags = 0
        self.previous: object = None
        #: the front-end hung up during the import: it takes no worker now
        self.hung_up = False

    def __enter__(self) -> ExitOnHangup:
        self.reaper.after_collect = self.exit_if_done
        self.previous = signal.signal(signal.SIGIO, self.look)
        fd = self.control.fileno()
        fcntl.fcntl(fd, fcntl.F_SETOWN, os.getpid())
        self.flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, self.flags | os.O_ASYNC)
        self.look()  # it may have come before
        return self

    def __exit__(self, *_exc: object) -> None:
        fcntl.fcntl(self.control.fileno(), fcntl.F_SETFL, self.flags)  # no SIGIO from now on
        signal.signal(signal.SIGIO, self.previous)  # type: ignore[arg-type]
        self.reaper.after_collect = None

    def look(self, *_signal: object) -> None:
        if not self.hung_up:
            self.hung_up = hung_up(self.control)
        self.exit_if_done()

    def exit_if_done(self) -> None:
        """Exit now if the front-end hung up and every worker's exit is reported: nobody is
        left to fork for or to report to, and a half-done import's teardown is not worth
        the risk. A collection under way (this handler interrupted it) calls back when done."""
        if self.hung_up and not self.reaper.busy and self.reaper.family.empty:
            os._exit(0)


def hung_up(control: socket.socket) -> bool:
    """Whether the front-end closed or shut down its end of ``control``, even behind a launch
    request still queued there (a launch in flight as the server stops): a peek sees only
    that request, so the hang-up went unseen until the import ended. The peek stays for a
    system whose poll does not say so."""
    poller = select.poll()
    poller.register(control, select.POLLRDHUP)
    if any(mask & _PEER_GONE for _fd, mask in poller.poll(0)):
        return True
    try:
        return not control.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False  # nothing to read: a request has not arrived, nor the end
    except OSError:
        return True


#: what ``poll`` reports for a socket whose peer has closed or shut down its end
_PEER_GONE = select.POLLRDHUP | select.POLLHUP | select.POLLERR


class ReapDuringImport:
    """While it is active, ``SIGCHLD`` runs ``family.collect()`` from a signal handler: the
    loop that reaps is blocked in the import, and a worker killed then (the server's first
    cancel, seconds after its start) had its exit reported only once the import ended, so
    the cancel took as long as the rest of the import. Python runs the handler between the
    import's bytecodes, in this thread; no fork happens meanwhile."""

    def __init__(self, family: Family) -> None:
        self.family = family
        self.busy = False
        self.again = False
        self.previous: object = None
        #: what runs after each collection (``ExitOnHangup.exit_if_done``)
        self.after_collect: Callable[[], None] | None = None

    def __enter__(self) -> ReapDuringImport:
        self.previous = signal.signal(signal.SIGCHLD, self.child_exited)
        # A worker that exited since the loop's last collection sent its SIGCHLD before this
        # handler: unreaped, its report (and a stopping launcher's exit) waited for the import.
        self.child_exited()
        return self

    def __exit__(self, *_exc: object) -> None:
        signal.signal(signal.SIGCHLD, self.previous)  # type: ignore[arg-type]

    def child_exited(self, *_signal: object) -> None:
        if self.busy:  # a handler may run inside the handler: the running one goes again
            self.again = True
            return
        self.busy = True
        try:
            self.again = True
            while self.again:
                self.again = False
                # Never into the import: the loop collects again once the import is done.
                with contextlib.suppress(Exception):
                    self.family.collect()
        finally:
            self.busy = False
        if self.after_collect is not None:
            self.after_collect()


def preload(names: Sequence[str]) -> list[str]:
    """Import the installed modules of ``names`` (a failure is printed: the workers then
    import them themselves), then stop the native threads their loading started (the fork
    rule); returns the modules now loaded."""
    loaded = []
    for name in names:
        if importlib.util.find_spec(name) is None:
            continue  # not installed: nothing to preload
        try:
            importlib.import_module(name)
        except Exception as exc:
            print(f"kcoral launcher: cannot preload {name}: {exc}", file=sys.stderr, flush=True)
            continue
        loaded.append(name)
    stop_blas_pools()
    keep_preload_finalizers_from_exit()
    freeze_heap()
    return loaded


def freeze_heap() -> None:
    """Run a trivial program's path (after the preload too: its imports evict what the
    path cached), collect, then freeze what survives: pages the children never write stay
    shared, and their collections skip those objects. Then fold the heap into huge pages:
    each fork copies far fewer page-table entries (``huge_pages``)."""
    import gc

    from kcoral_server.worker.warm_up import warm_up_for_forks

    global warmed_for_forks
    warmed_for_forks = warm_up_for_forks()  # made once here for every worker forked
    gc.collect()
    gc.freeze()
    collapse_heap()


#: the function OpenBLAS's own ``pthread_atfork`` prepare handler calls: it joins the pool
#: threads, and the next BLAS call starts them again
_BLAS_SHUTDOWN = "blas_thread_shutdown_"


def stop_blas_pools() -> int:
    """Stop the thread pool of every OpenBLAS loaded here (numpy's bundled one included);
    returns how many were stopped. Each starts again, with its configured number of
    threads, at the first BLAS call of the process that makes it (a forked worker)."""
    stopped = 0
    for path in _loaded_libraries():
        if "openblas" not in os.path.basename(path).lower():
            continue
        try:
            library = ctypes.CDLL(path)  # already loaded: the same handle, no new init
            getattr(library, _BLAS_SHUTDOWN)()
        except (OSError, AttributeError):
            continue  # not an OpenBLAS we know how to stop: the thread check will say so
        stopped += 1
    return stopped


def _loaded_libraries() -> list[str]:
    """Paths of the shared objects mapped into this process."""
    found: dict[str, None] = {}
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and ".so" in fields[5]:
                    found.setdefault(fields[5].strip(), None)
    except OSError:
        return []
    return list(found)


# ---------------------------------------------------------------------- command line

_USAGE = (
    f"usage: python -m {ENTRY_MODULE} --fd N [--parent PID] [--preload MODULE,...]"
    " [--log-fd N] | --supervise PARENT_PID"
)


def _parse_launcher_args(args: Sequence[str]) -> dict[str, str] | None:
    """``--fd``, ``--parent``, ``--preload`` and ``--log-fd`` (each at most once, ``--fd``
    required), or None for anything else."""
    if len(args) % 2:
        return None
    options = dict(zip(args[::2], args[1::2], strict=True))
    if len(options) != len(args) // 2 or "--fd" not in options:
        return None
    if not set(options) <= {"--fd", "--parent", "--preload", "--log-fd"}:
        return None
    numbers = ("--fd", "--parent", "--log-fd")
    if not all(options[name].isdigit() for name in numbers if name in options):
        return None
    preload_names = options.get("--preload", "").split(",") if "--preload" in options else []
    if not set(preload_names) <= set(PRELOADABLE):
        return None
    return options


def take_log_pipe(fd: int) -> None:
    """Make ``fd``, the pipe the front-end relays (``log_relay``), this launcher's stdout and
    stderr; every child it forks puts ``/dev/null`` there first (``become_worker``)."""
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "--supervise":
        return supervise(int(args[1]))
    options = _parse_launcher_args(args)
    if options is None:
        print(_USAGE, file=sys.stderr)
        return 2
    if "--log-fd" in options:
        take_log_pipe(int(options["--log-fd"]))
    control = socket.socket(fileno=int(options["--fd"]))
    parent = int(options["--parent"]) if "--parent" in options else None
    names = options["--preload"].split(",") if "--preload" in options else []
    child = serve(control, parent, names)
    if child is None:
        return 0
    code = run_child(child)
    quick_exit(code)
    return code  # pragma: no cover
