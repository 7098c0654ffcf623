"""The bubblewrap sandbox of worker processes (SERVER.md §14) and what a program's
environment may hold.

Who can reach what: a *program* (uploaded code) runs in a worker. Whatever the sandbox, its
environment holds no KCoral secret (``is_secret_variable``: every ``KCORAL_*`` name with
``TOKEN`` or ``SECRET`` in it) and no variable the operator denied (``--worker-env-deny``):
``worker_base_environment`` scrubs them before any worker, launcher or supervisor starts.
Under bubblewrap it also sees no other process (PID namespace), no network, nothing the
server keeps for itself (``hidden_paths``: the token file, the event log with every
identity's program sources and output, the disk cache, the ready file; each one that a
read-only bind would expose is covered) and only the system, Python and package
directories read-only; without a sandbox it can read whatever the server's user can.

Front-end side only: the start-up probe (``--sandbox auto`` falls back to ``none`` with a
``sandbox_disabled`` WARNING; an explicit ``bubblewrap`` that cannot run refuses to start),
the check of ``--sandbox-readonly-path`` values, and, per worker, a private host directory
that becomes the sandbox's writable workspace plus the ``bwrap`` command line that runs the
worker inside it. The worker side (clearing the workspace between programs) lives in
``kcoral_server.worker.confinement``.

Layout inside a sandbox: read-only system directories, Python prefixes, the package and each
read-only path (at their host paths); the worker's host directory mounted read-write at
``/work`` (or, when ``/work`` would shadow a read-only path such as an editable install's
source tree, the first free name of ``WORKSPACE_MOUNTS``); runtime state under
``<mount>/.kcoral/``; ``/tmp``, ``/var/tmp`` and ``/dev/shm`` private tmpfs of a fixed size
each (``tmpfs_bytes``): their pages are charged to the memory cgroup of the worker that
writes them, and the size bounds them where no cgroup does (issue 28: a program put 1.9 GB
into the workspace, ``/tmp`` and ``/dev/shm``; the workspace itself is watched by
``workspace_watch``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kcoral_server.gpu.device_nodes import device_nodes
from kcoral_server.storage.trees import remove_tree

PROBE_TIMEOUT_SECONDS = 10.0
PROBE_TMPFS_BYTES = 1 << 20
DISABLED_MESSAGE = "the bubblewrap sandbox is unusable; continuing with --sandbox none"
REFUSED_MESSAGE = "--sandbox bubblewrap cannot run here"
WORKSPACE_MOUNTS = ("/work", "/workspace", "/kcoral-work")
STATE_DIRS = ("tmp", "home", "cache", "cuda", "triton", "extensions", "libraries", "output", "shm")
# Cleared between programs together with the workspace itself (caches survive reuse).
SCRATCH_STATE_DIRS = ("tmp", "shm")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
GPU_CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
# Front-end secrets no program has any business reading from its environment; every other
# ``KCORAL_*`` name with TOKEN or SECRET in it is one too (``is_secret_variable``).
SECRET_VARIABLES = ("KCORAL_AUTH_TOKEN", "KCORAL_NODE_TOKEN", "KCORAL_TOKEN")
SECRET_MARKERS = ("TOKEN", "SECRET")
# Linked into the workspace's runtime state inside the sandbox.
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
# Set in a sandboxed worker's environment: its /tmp, /var/tmp and /dev/shm are private
# tmpfs: JSON {"roots": [...], "keep": [read-only binds inside them, e.g. an install under
# /tmp]}. The front-end cannot reach them, so each worker empties them itself.
PRIVATE_TMP_ENV = "KCORAL_SANDBOX_PRIVATE_TMP"
# The size of each of those tmpfs when the caller names none.
DEFAULT_TMPFS_BYTES = 1024**3
# The empty read-only tmpfs over a server directory a bind would expose (hidden_paths).
HIDING_TMPFS_BYTES = 4096


class SandboxError(ValueError):
    """The sandbox settings are unusable (e.g. a read-only path that exposes workspaces)."""


class SandboxUnavailable(SandboxError):
    """``--sandbox bubblewrap`` was asked for explicitly and cannot run (exit 2)."""


def is_secret_variable(name: str) -> bool:
    """Whether ``name`` holds a KCoral secret (client, node, router or child token)."""
    return name in SECRET_VARIABLES or (
        name.startswith("KCORAL_") and any(marker in name for marker in SECRET_MARKERS)
    )


def is_denied(name: str, deny: Iterable[str]) -> bool:
    """Whether ``name`` matches an operator's ``--worker-env-deny`` entry (exact, or a
    prefix ending in ``*``)."""
    for entry in deny:
        if entry.endswith("*") and name.startswith(entry[:-1]):
            return True
        if name == entry:
            return True
    return False


def worker_base_environment(
    environ: Mapping[str, str] | None = None, deny: Iterable[str] = ()
) -> dict[str, str]:
    """``environ`` (default: the front-end's) without KCoral secrets and denied variables:
    the starting point of every worker's, launcher's and supervisor's environment."""
    environ = os.environ if environ is None else environ
    deny = list(deny)
    return {
        name: value
        for name, value in environ.items()
        if not is_secret_variable(name) and not is_denied(name, deny)
    }


def workspace_root() -> Path:
    """Host directory under which every worker's sandbox directory is created."""
    return Path(tempfile.gettempdir()).resolve()


def _is_within(path: Path, ancestor: Path) -> bool:
    return path == ancestor or ancestor in path.parents


def check_readonly_paths(paths: Iterable[Path], root: Path | None = None) -> list[Path]:
    """Resolved ``paths``; ``SandboxError`` for ``/`` or an ancestor of the workspace root
    (binding one would expose every worker's workspace, §14), and for paths under the
    directory each sandbox replaces with its own ``/dev/shm`` (paths under ``/tmp`` and
    ``/var/tmp`` are handled by ``SandboxDir.command``)."""
    root = (root or workspace_root()).resolve()
    checked = []
    for path in paths:
        resolved = Path(os.path.abspath(path)).resolve()
        if resolved == Path("/") or _is_within(root, resolved):
            raise SandboxError(
                f"--sandbox-readonly-path {str(path)!r} is '/' or an ancestor of the "
                f"sandbox workspace root {str(root)!r}"
            )
        if _is_within(resolved, Path("/dev/shm")):
            # bwrap would have to create mount points inside the workspace's scratch state
            raise SandboxError(
                f"--sandbox-readonly-path {str(path)!r} lies under /dev/shm, which is "
                "private to each sandbox"
            )
        checked.append(resolved)
    return checked


def probe(bwrap: str | None = None, timeout: float = PROBE_TIMEOUT_SECONDS) -> str | None:
    """``None`` when ``bwrap`` can build a sandbox here, else why not."""
    if not sys.platform.startswith("linux"):
        return f"the sandbox needs Linux (this is {sys.platform})"
    bwrap = bwrap or shutil.which("bwrap")
    if bwrap is None:
        return "bwrap was not found on PATH"
    # The mounts a worker's sandbox makes (SandboxDir.command), not only its namespaces: a
    # container's masked /proc lets bwrap unshare but refuses the fresh procfs ("Can't mount
    # proc on /newroot/proc"), and a probe without --proc passed there while every worker
    # failed; the node restarted its server for ever rather than exit 2 saying why.
    command = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    command += ["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
    command += ["--size", str(PROBE_TMPFS_BYTES), "--tmpfs", "/tmp", "true"]
    try:
        done = subprocess.run(command, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return f"bwrap did not finish within {timeout:g} s"
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    if done.returncode != 0:
        text = done.stderr.decode(errors="replace").strip()
        return text or f"bwrap exited with code {done.returncode}"
    return None


def resolve_sandbox(sandbox: str, readonly_paths: Sequence[Path], events: Any) -> str:
    """The sandbox the server will use (``bubblewrap`` or ``none``).

    ``auto`` is bubblewrap when the probe works, else ``none`` after a ``sandbox_disabled``
    WARNING event and a Python warning (never silently). An explicit ``bubblewrap`` that
    cannot run raises ``SandboxUnavailable``: the operator asked for confinement, so running
    programs unconfined would be a silent downgrade. Raises ``SandboxError`` for a refused
    read-only path."""
    if sandbox not in ("auto", "bubblewrap"):
        return "none"
    check_readonly_paths(readonly_paths)
    error = probe()
    if error is None:
        return "bubblewrap"
    if sandbox == "bubblewrap":
        raise SandboxUnavailable(f"{REFUSED_MESSAGE}: {error}")
    events.emit(
        "sandbox_disabled", "WARNING", sandbox=sandbox, error=error, message=DISABLED_MESSAGE
    )
    warnings.warn(f"{DISABLED_MESSAGE}: {error}", RuntimeWarning, stacklevel=2)
    return "none"


def _package_roots() -> list[Path]:
    """Directories holding the ``kcoral`` and ``kcoral_server`` packages (an editable install
    points into the source tree, which must then be visible too)."""
    import kcoral
    import kcoral_server

    roots = []
    for module in (kcoral, kcoral_server):
        roots.append(Path(module.__file__).resolve().parent.parent)  # type: ignore[arg-type]
    return roots


def readonly_binds(extra: Sequence[Path], environ: Mapping[str, str]) -> list[Path]:
    """Every host path bound read-only, outermost first and without nested duplicates."""
    root = workspace_root()
    candidates = [Path(d) for d in SYSTEM_DIRS if not os.path.islink(d)]
    candidates += [Path(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)]
    candidates.append(Path(sys.executable).resolve().parent)
    candidates += _package_roots()
    for entry in environ.get("PYTHONPATH", "").split(os.pathsep):
        if entry and os.path.isabs(entry):
            candidates.append(Path(entry))
    candidates += list(extra)
    binds: list[Path] = []
    for path in candidates:
        if not path.exists():
            continue
        path = path.resolve()
        if path == Path("/") or _is_within(root, path):
            continue  # never expose the workspace root (only reachable via PYTHONPATH here)
        binds.append(path)
    return _outermost(binds)


def hidden_under(paths: Iterable[str | os.PathLike], binds: Sequence[Path]) -> list[Path]:
    """The existing files and directories of ``paths`` that lie in one of ``binds``
    (resolved, outermost first, none inside a directory already listed)."""
    found = []
    for path in paths:
        resolved = Path(os.path.abspath(path)).resolve()
        if not (resolved.is_file() or resolved.is_dir()):
            continue  # missing (or a device, a socket): nothing a bind shows of it
        if any(_is_within(resolved, bind) for bind in binds):
            found.append(resolved)
    return _outermost(found)


def _outermost(paths: list[Path]) -> list[Path]:
    """``paths`` outermost first, without those inside a directory already kept."""
    kept: list[Path] = []
    for path in sorted(paths, key=lambda p: len(p.parts)):
        if not any(_is_within(path, outer) for outer in kept):
            kept.append(path)
    return kept


#: paths the server keeps for itself beyond its configuration (``keep_from_programs``)
_server_private: list[Path] = []


def keep_from_programs(*paths: str | os.PathLike | None) -> None:
    """Hide ``paths`` (the ``--ready-file``) from the programs of every sandbox made from
    now on, where a read-only bind would expose them (``SandboxDir`` ``hidden_paths``)."""
    _server_private.extend(Path(os.path.abspath(p)) for p in paths if p is not None)


def server_private_paths() -> list[Path]:
    """What ``keep_from_programs`` registered."""
    return list(_server_private)


def system_links() -> list[tuple[str, str]]:
    """``(target, path)`` of system directories that are symlinks (merged ``/usr``: ``/bin``
    -> ``usr/bin``); recreated as links so the dynamic loader's paths keep working."""
    return [(os.readlink(d), d) for d in SYSTEM_DIRS if os.path.islink(d)]


def choose_mount(binds: Sequence[Path]) -> str:
    """``/work`` unless it would shadow or sit inside a read-only bind."""
    for name in WORKSPACE_MOUNTS:
        mount = Path(name)
        if not any(_is_within(bind, mount) or _is_within(mount, bind) for bind in binds):
            return name
    raise SandboxError("no free mount point for the sandbox workspace")


def state_path(mount: str, name: str) -> str:
    return f"{mount}/.kcoral/{name}"


class SandboxDir:
    """One worker's sandbox: its host directory and how to launch the worker inside."""

    def __init__(
        self,
        *,
        readonly_paths: Sequence[Path] = (),
        device: str = "cpu",
        gpu_ids: Sequence[int] = (),
        environ: Mapping[str, str] | None = None,
        bwrap: str | None = None,
        hidden_paths: Sequence[Path] = (),
        tmpfs_bytes: int = DEFAULT_TMPFS_BYTES,
    ) -> None:
        self.bwrap = bwrap or shutil.which("bwrap")
        self.tmpfs_bytes = tmpfs_bytes
        if self.bwrap is None:
            raise SandboxError("bwrap was not found on PATH")
        environ = os.environ if environ is None else environ
        self.readonly_paths = check_readonly_paths(readonly_paths)
        self.binds = readonly_binds(self.readonly_paths, environ)
        self.mount = choose_mount(self.binds)
        # The server's own files that a read-only bind would expose (audit F3: the default
        # --log-dir of a server started in its editable checkout lay under the bound
        # checkout, so every program read every identity's program sources): a file is
        # covered by /dev/null, a directory by an empty read-only tmpfs. A path outside
        # every bind is invisible anyway.
        self.hidden = hidden_under(hidden_paths, self.binds)
        self.hidden_dirs = {path for path in self.hidden if path.is_dir()}
        self.device = device
        self.gpu_ids = list(gpu_ids)
        # the worker's GPUs by UUID, to find their device files (gpu_devices.py)
        self.visible_devices = environ.get("CUDA_VISIBLE_DEVICES", "")
        # Imported here: workers import this module (confinement), never the workspaces'.
        from kcoral_server.storage.workspace import SANDBOX_PREFIX, instance_prefix

        root = workspace_root()
        prefix = instance_prefix(SANDBOX_PREFIX, root)  # a killed server's is found stale
        self.host_dir = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
        for name in STATE_DIRS:
            (self.host_dir / ".kcoral" / name).mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.host_dir / ".kcoral" / "cache" / "tvm-ffi").mkdir(mode=0o700, exist_ok=True)

    def environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """The worker's environment inside the sandbox (§14 variables set)."""
        result = {k: v for k, v in env.items() if not is_secret_variable(k)}
        result.update(self._sandbox_variables)
        extra_dirs = [str(p) for p in self.readonly_paths if p.is_dir()]
        existing = [e for e in env.get("PYTHONPATH", "").split(os.pathsep) if e]
        path = list(dict.fromkeys(extra_dirs + existing))
        if path:
            result["PYTHONPATH"] = os.pathsep.join(path)
        return result

    @functools.cached_property
    def _sandbox_variables(self) -> dict[str, str]:
        """The §14 variables, the same for every worker of this directory: worked out once
        (comparing every bind with the private tmpfs took ~0.3 ms of each worker's start)."""
        state = {name: state_path(self.mount, name) for name in STATE_DIRS}
        variables = dict(
            HOME=state["home"],
            TMPDIR=state["tmp"],
            TMP=state["tmp"],
            TEMP=state["tmp"],
            XDG_CACHE_HOME=state["cache"],
            CUDA_CACHE_PATH=state["cuda"],
            TRITON_CACHE_DIR=state["triton"],
            TORCH_EXTENSIONS_DIR=state["extensions"],
            TVM_FFI_CACHE_DIR=state_path(self.mount, "cache/tvm-ffi"),
            PYTHONDONTWRITEBYTECODE="1",
            PYTHONNOUSERSITE="1",
            PWD=self.mount,
        )
        tmpfs = self.private_tmp_dirs()
        if tmpfs:
            keep = [str(b) for b in self.binds if any(_is_within(b, Path(d)) for d in tmpfs)]
            variables[PRIVATE_TMP_ENV] = json.dumps({"roots": tmpfs, "keep": keep})
        return variables

    def private_tmp_dirs(self) -> list[str]:
        """The sandbox's private tmpfs (``/tmp``, ``/var/tmp``, ``/dev/shm``; see
        ``command``), which each worker empties itself."""
        return list(PRIVATE_DIRS)

    def command(self, worker_command: Sequence[str]) -> list[str]:
        """``bwrap ... -- <worker_command>``; inherited fds (the IPC socket) stay open."""
        assert self.bwrap is not None
        argv = [self.bwrap, "--unshare-all", "--die-with-parent", "--new-session"]
        argv += ["--cap-drop", "ALL"]
        # /tmp and /var/tmp are private tmpfs of a fixed size (memory, charged to the
        # worker's cgroup: a program cannot fill the host's disk through them), made before
        # the binds so that a read-only path under them (an install or checkout that lives
        # there) gets its mount point inside. TMPDIR and the other variables still point
        # into the workspace's state, which workspace_watch bounds.
        size = str(self.tmpfs_bytes)
        for directory in ("/tmp", "/var/tmp"):
            argv += ["--size", size, "--tmpfs", directory]
        for path in self.binds:
            argv += ["--ro-bind", str(path), str(path)]
        for target, link in system_links():
            argv += ["--symlink", target, link]
        for path in self.hidden:  # after the binds they cover
            if path in self.hidden_dirs:
                argv += ["--size", str(HIDING_TMPFS_BYTES), "--tmpfs", str(path)]
                argv += ["--remount-ro", str(path)]
            else:
                argv += ["--ro-bind", "/dev/null", str(path)]
        argv += ["--proc", "/proc", "--dev", "/dev"]
        if self.device == "gpu":
            nodes = [*GPU_CONTROL_NODES, "/dev/nvidia-modeset"]
            nodes += device_nodes(self.gpu_ids, self.visible_devices)  # by identity
            for node in nodes:
                argv += ["--dev-bind-try", node, node]
            argv += ["--ro-bind-try", "/sys", "/sys"]  # the driver reads PCI topology there
        argv += ["--bind", str(self.host_dir), self.mount]
        # over the directory --dev made: shared memory of the same size, charged likewise
        argv += ["--size", size, "--tmpfs", "/dev/shm"]
        argv += ["--chdir", self.mount, "--", *worker_command]
        return argv

    def remove(self) -> bool:
        """Delete the host directory (the worker has exited); False when some of it stayed.
        Never raises, whatever tree a program left there (``storage.trees``)."""
        return remove_tree(self.host_dir)

    def run_program(self, message: Any, fd_count: int) -> tuple[Any, list[int]]:
        """``RunProgram`` as the sandboxed worker must see it, plus fds to append to its frame.

        The workspace is the sandbox mount (the front-end makes no per-request directory
        for a sandboxed program: none would be visible inside); the capture files stay
        where the front-end reads them and travel as open descriptors (``capture_fds`` are
        their indexes in the frame). The caller closes the returned fds after sending.
        """
        opened: list[int] = []
        indexes: list[int] = []
        stdout_path = stderr_path = None
        if message.stdout_path is not None and message.stderr_path is not None:
            try:
                for path in (message.stdout_path, message.stderr_path):
                    opened.append(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC))
            except OSError:
                for fd in opened:
                    os.close(fd)
                raise
            indexes = [fd_count, fd_count + 1]
            stdout_path = state_path(self.mount, "output/stdout")
            stderr_path = state_path(self.mount, "output/stderr")
        translated = dataclasses.replace(
            message,
            workspace=self.mount,
            stdout_path=stdout_path,
            stderr_path=stderr_path,
            capture_fds=indexes,
        )
        return translated, opened
