"""The node supervisor (ROUTER.md §12): runs the server as a child, probes it, restarts it,
and reports its health to the router over ``ConnectSupervisor``.

Entry point: ``run_supervisor(settings, argv)``, used by ``kcoral server`` when ``--router``
is given without ``--node-child``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import io
import ipaddress
import json
import os
import random
import secrets as secrets_module
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil

from kcoral_server.front_door.callers import NODE_HANGUP
from kcoral_server.gpu.inventory import DeviceError, choose_devices
from kcoral_server.gpu.kind import UNKNOWN_KIND, NodeKind, describe_node
from kcoral_server.node.handover import (
    SECRETS_FD_ENV,
    SUPERVISOR_PID_ENV,
    NodeSecrets,
    child_environment,
    write_secrets,
)
from kcoral_server.node.http11 import get_json
from kcoral_server.node.metrics_fetch import MetricsReader
from kcoral_server.node.status_stream import stream_status, supervisor_status
from kcoral_server.processes.stop_signals import then_ignoring_stop_signals
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.router.log import RouterLog
from kcoral_server.router.nodes.registry import SERVER_STARTING, SERVER_STOPPED
from kcoral_server.settings.command_line import ServerSettings, listen_flags, supervisor_flags
from kcoral_server.storage.ready_file import try_write_ready_file

USAGE_ERROR = 2  # the exit status of a server that refuses its settings
PR_SET_CHILD_SUBREAPER = 36
# Test-only: a JSON object merged into the reported ``versions`` (cohort tests).
VERSIONS_OVERRIDE_ENV = "KCORAL_TEST_VERSIONS_OVERRIDE"
# Test-only: a JSON object of NodeKind fields reported instead of the probed kind (mixed
# fleets of CPU nodes).
NODE_KIND_OVERRIDE_ENV = "KCORAL_TEST_NODE_KIND"
# Options that the supervisor owns or passes through the environment instead: the listen
# settings, the node's identity and the supervisor's own (declared in cli_args).
STRIPPED_OPTIONS = frozenset(
    {
        *listen_flags(),
        "--router",
        "--node-id",
        "--node-token",
        "--node-label",  # reported by the supervisor (ROUTER §6)
        # The child holds no client token: only its tunnel reaches it (ROUTER §12).
        "--auth-token-file",
        *supervisor_flags(),
    }
)


def child_settings_problem(
    settings: Any, argv: Sequence[str], environ: Mapping[str, str]
) -> str | None:
    """Why the child server would refuse its settings (it exits 2), or None.

    Checked before the supervisor starts: a child that cannot start with these settings
    would otherwise exit 2 and be restarted forever with back-off."""
    from kcoral_server.processes.sandbox import SandboxError, SandboxUnavailable, resolve_sandbox
    from kcoral_server.settings.command_line import parse_server_args

    child_argv = [
        *child_arguments(argv),
        "--host",
        settings.host,
        "--port",
        str(settings.port),
        "--node-child",
    ]
    child_env = {
        **environ,
        "KCORAL_ROUTER_ENDPOINT": settings.config.router_endpoint,
        "KCORAL_NODE_ID": settings.config.node_id,
    }
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            child = parse_server_args(child_argv, child_env)
    except SystemExit as exc:
        if exc.code == 0:
            return None
        lines = errors.getvalue().strip().splitlines()
        return lines[-1] if lines else f"the server's settings are invalid (exit {exc.code})"
    if child.config.sandbox == "bubblewrap":  # explicit: the child refuses to run unconfined
        try:
            resolve_sandbox("bubblewrap", child.config.sandbox_readonly_paths, None)
        except (SandboxUnavailable, SandboxError) as exc:
            return str(exc)
    return None


def child_arguments(argv: Sequence[str]) -> list[str]:
    """The server options of ``argv`` without the supervisor's own (all take a value)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in STRIPPED_OPTIONS:
            skip = "=" not in arg
            continue
        if arg == "--node-child":
            continue
        out.append(arg)
    return out


def probe_target(host: str) -> tuple[str, tuple[str, int] | None]:
    """Where to probe a server listening on ``host``: always a loopback peer (§12)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return "127.0.0.1", None  # a host name: the server also listens on loopback
    if address.is_unspecified:
        return ("::1" if address.version == 6 else "127.0.0.1"), None
    if address.is_loopback:
        return host, None
    return host, ("::1" if address.version == 6 else "127.0.0.1", 0)


def healthy_body(body: Any) -> str | None:
    """Why a worker-status body is not healthy, or None."""
    if not isinstance(body, dict):
        return "worker-status is not a JSON object"
    if body.get("status") != "ok":
        return f"worker-status says {body.get('status')!r}"
    if not isinstance(body.get("instance_id"), str) or not body["instance_id"]:
        return "worker-status has no instance_id"
    workers, busy = body.get("worker_count"), body.get("busy_workers")
    if type(workers) is not int or workers < 1:
        return "worker-status has no worker seats"
    if type(busy) is not int or not 0 <= busy <= workers:
        return "worker-status busy_workers is invalid"
    for key in ("target", "versions"):
        value = body.get(key)
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            return f"worker-status {key} is not a string map"
    return None


async def probe_child(
    child_url: str, listen_host: str, router_secret: str, timeout: float
) -> tuple[str | None, Any]:
    """Ask the child's /internal/worker-status; (failure text or None, the body)."""
    parts = urlsplit(child_url)
    host, local = probe_target(listen_host)
    try:
        status, body = await asyncio.wait_for(
            get_json(
                host,
                parts.port or 80,
                "/internal/worker-status",
                local_addr=local,
                bearer=router_secret,
            ),
            timeout,
        )
    except asyncio.TimeoutError:
        return "worker-status probe timed out", None
    except OSError as exc:
        return f"worker-status probe failed: {exc}", None
    except Exception as exc:
        return f"worker-status probe failed: {type(exc).__name__}: {exc}", None
    if not 200 <= status < 300:
        return f"worker-status answered HTTP {status}", None
    return healthy_body(body), body


def set_child_subreaper() -> None:
    """Become the reaper of orphaned descendants so none escapes a restart."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def kill_descendants() -> None:
    """SIGKILL every descendant (setsid ones included: we are their subreaper) and reap."""
    for _ in range(5):
        children = psutil.Process().children(recursive=True)
        if not children:
            return
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.kill()
        for child in children:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(child.pid, 0)


def reap_zombies(keep: int | None) -> None:
    for child in psutil.Process().children():
        if child.pid == keep:
            continue
        with contextlib.suppress(psutil.Error, ChildProcessError, OSError):
            if child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, os.WNOHANG)


def probe_kind(settings: ServerSettings) -> NodeKind:
    """A node's kind, found as its child server resolves its devices (a subprocess probe:
    the supervisor never imports torch)."""
    config = settings.config
    try:
        choice = choose_devices(
            config.device,
            config.gpus,
            gpus_given=settings.gpus_given,
            fake_gpu_count=config.fake_gpu_count,
        )
    except DeviceError:
        return NodeKind(UNKNOWN_KIND)  # the child refuses to start and says why
    return describe_node(choice.mode, choice.gpus)


def child_end(returncode: int) -> str:
    """How the child ended, for ``server_child_restarting`` and the router's ``last_error``:
    ``was killed by SIGKILL``, not ``exited with status -9`` (Popen's code for a signal)."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        return f"was killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"was killed by signal {-returncode}"


class Supervisor:
    # How the child server is started; the hidden --node-child makes it serve and open the
    # slots without starting another supervisor.
    child_command: tuple[str, ...] = (sys.executable, "-m", "kcoral", "server")

    def __init__(self, settings: Any, argv: Sequence[str], environ: Mapping[str, str]) -> None:
        from kcoral_server.settings.command_line import SupervisorOptions

        self.settings = settings
        self.config = settings.config
        self.options = settings.supervisor or SupervisorOptions()
        self.argv = list(argv)
        self.environ = dict(environ)
        self.log = RouterLog(problems_only=not self.config.log_console)
        self.instance_id = str(uuid.uuid4())
        self.stopping = asyncio.Event()
        self.exit_code = 0  # USAGE_ERROR once the child refused its settings
        self.status_changed = asyncio.Event()
        self.child: subprocess.Popen[bytes] | None = None
        self.child_url: str | None = None
        self.healthy = False
        self.last_healthy_at: float | None = None
        self.last_error = SERVER_STARTING
        self.body: dict[str, Any] = {}
        # The child said it drains (SIGTERM'd alone, or with us as Slurm and Kubernetes do):
        # reported as the node's `draining` until a new child starts (ROUTER §6).
        self.child_draining = False
        self.versions_override: dict[str, str] = {}
        override = self.environ.get(NODE_KIND_OVERRIDE_ENV)
        self.node_kind = NodeKind(**json.loads(override)) if override else None  # _probed
        raw = self.environ.get(VERSIONS_OVERRIDE_ENV)
        if raw:
            self.versions_override = {str(k): str(v) for k, v in json.loads(raw).items()}
        # Both made fresh at each child start (start_child). The probe presents the router
        # secret, without which the child answers nothing (ROUTER §12); the slot key is
        # announced in every status, and the router opens this node's slots only for a
        # hello that carries it, so the node token alone cannot take this node's seats.
        self.router_secret = ""
        # A key from the start, not "": the status stream may connect before the first
        # child start, and a first status without a key reads as a published supervisor
        # (the router's node_without_slot_key warning). start_child makes a fresh one.
        self.slot_key = secrets_module.token_urlsafe(32)
        self.workdir = Path(tempfile.mkdtemp(prefix="kcoral-supervisor-"))
        self.metrics = MetricsReader(self.options, probe_target(settings.host), self.log)
        self.user_ready_written = False

    # -- status reports --------------------------------------------------------------------

    def status(self) -> pb.SupervisorStatus:
        return supervisor_status(self)

    def report(self) -> None:
        self.status_changed.set()

    async def report_loop(self) -> None:
        """Stream ``status()`` to the router until the supervisor stops (``status_stream``)."""
        await stream_status(
            self.config,
            self.status,
            self.status_changed,
            interval=self.options.health_interval_seconds,
            done=lambda: self.stopping.is_set() and self.child is None,
            log=self.log,
        )

    # -- the child server ------------------------------------------------------------------

    def start_child(self) -> None:
        ready = self.workdir / "child-ready"
        with contextlib.suppress(FileNotFoundError):
            ready.unlink()
        host, port = self.settings.host, self.settings.port
        args = [
            *self.child_command,
            *child_arguments(self.argv),
            "--host",
            host,
            "--port",
            str(port),
            "--ready-file",
            str(ready),
            "--node-child",
        ]
        # No credential in the child's environment or command line (its workers would
        # inherit them); the node token and a fresh router secret go through a pipe.
        env = child_environment(self.environ)
        env.pop(VERSIONS_OVERRIDE_ENV, None)
        env.pop(NODE_KIND_OVERRIDE_ENV, None)
        self.router_secret = secrets_module.token_urlsafe(32)
        self.slot_key = secrets_module.token_urlsafe(32)
        secrets = NodeSecrets(self.config.node_token, self.router_secret, self.slot_key)
        secrets_fd = write_secrets(secrets)
        env.update(
            KCORAL_ROUTER_ENDPOINT=self.config.router_endpoint,
            KCORAL_NODE_ID=self.config.node_id,
            KCORAL_SERVER_HOST=host,
            KCORAL_SERVER_PORT=str(port),
            **{SECRETS_FD_ENV: str(secrets_fd), SUPERVISOR_PID_ENV: str(os.getpid())},
        )
        try:
            self.child = subprocess.Popen(args, env=env, pass_fds=(secrets_fd,))
        finally:
            os.close(secrets_fd)
        self.child_url = None
        self.child_draining = False
        self.metrics.restart()
        self.log.event("server_child_started", node_id=self.config.node_id, pid=self.child.pid)

    async def probe(self) -> str | None:
        """One probe; return the failure text or None when healthy."""
        if self.child_url is None:
            ready = self.workdir / "child-ready"
            with contextlib.suppress(OSError):
                text = ready.read_text().strip()
                if text:
                    self.child_url = text
            if self.child_url is None:
                return SERVER_STARTING
        problem, body = await probe_child(
            self.child_url,
            self.settings.host,
            self.router_secret,
            self.options.health_timeout_seconds,
        )
        if problem is None:
            self.body = body
            # Only `true` counts: a child of another version leaves it out.
            self.child_draining = self.child_draining or body.get("draining") is True
            await self.metrics.refresh(self.child_url, self.router_secret)
        return problem

    async def stop_child(self, grace: float | None) -> int | None:
        """SIGTERM the child, SIGKILL after ``grace`` (None = wait forever), reap all."""
        child = self.child
        code = None
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM)
            deadline = None if grace is None else time.monotonic() + grace
            while child.poll() is None:
                if deadline is not None and time.monotonic() >= deadline:
                    with contextlib.suppress(ProcessLookupError):
                        child.kill()
                    deadline = None
                await asyncio.sleep(0.05)
            code = child.returncode
        await asyncio.get_running_loop().run_in_executor(None, kill_descendants)
        self.child = None
        self.healthy = False
        return code

    async def sleep_or_stop(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)

    async def supervise(self) -> None:
        options = self.options
        delay = options.restart_min_delay_seconds
        while not self.stopping.is_set():
            self.healthy = False
            self.last_error = SERVER_STARTING
            self.report()
            await asyncio.get_running_loop().run_in_executor(None, kill_descendants)
            self.start_child()
            child = self.child
            assert child is not None  # start_child sets it or raises
            self.report()  # the new slot key reaches the router before the child's slots
            started = time.monotonic()
            healthy_since: float | None = None
            failures = 0
            while not self.stopping.is_set():
                code = child.poll()
                if code == USAGE_ERROR:
                    # The child refused its settings (its message is on stderr): a restart
                    # would only repeat that, so the supervisor stops with the same status.
                    self.log.event(
                        "server_child_refused_settings",
                        "ERROR",
                        node_id=self.config.node_id,
                        error="KCoral Server refused its settings (exit 2); not restarting",
                    )
                    self.exit_code = USAGE_ERROR
                    self.stopping.set()
                    return
                if code is not None:
                    drained = self.child_draining and code == 0
                    # a drain that ended as SERVER §12 says is a stop, not a crash
                    self.last_error = (
                        SERVER_STOPPED if drained else f"KCoral Server {child_end(code)}"
                    )
                    break
                reap_zombies(child.pid)
                problem = await self.probe()
                now = time.monotonic()
                if problem is None:
                    self.healthy = True
                    self.last_healthy_at = now
                    failures = 0
                    healthy_since = healthy_since or now
                    if now - healthy_since >= options.stable_reset_seconds:
                        delay = options.restart_min_delay_seconds
                    self.write_user_ready_file()
                else:
                    self.healthy = False
                    self.last_error = problem
                    healthy_since = None
                    if now - started >= options.startup_grace_seconds:
                        failures += 1
                if child.poll() is not None:
                    continue
                self.report()
                if failures >= options.failure_threshold:
                    self.log.event("server_child_unhealthy", "WARNING", error=self.last_error)
                    self.report()
                    await self.stop_child(options.termination_grace_seconds)
                    break
                await self.sleep_or_stop(options.health_interval_seconds)
            if self.stopping.is_set():
                return
            self.healthy = False
            self.report()
            if self.last_error == SERVER_STOPPED:  # drained (SIGTERM'd alone): no back-off
                delay = options.restart_min_delay_seconds
            self.log.event(
                "server_child_restarting",
                "INFO" if self.last_error == SERVER_STOPPED else "WARNING",
                node_id=self.config.node_id,
                error=self.last_error,
                delay_seconds=round(delay, 3),
            )
            await self.stop_child(options.termination_grace_seconds)
            jitter = options.restart_jitter
            await self.sleep_or_stop(delay * random.uniform(1 - jitter, 1 + jitter))
            delay = min(delay * 2, options.restart_max_delay_seconds)

    def write_user_ready_file(self) -> None:
        path = self.settings.ready_file
        if path is not None and not self.user_ready_written and self.child_url:
            self.user_ready_written = True
            if said := try_write_ready_file(path, self.child_url):
                sys.stderr.write(f"kcoral server --router: {said}\n")
                self.exit_code = 1
                self.stopping.set()

    def _probed(self, probe: asyncio.Future[NodeKind]) -> None:
        self.node_kind = NodeKind(UNKNOWN_KIND) if probe.exception() else probe.result()
        self.report()

    async def run(self) -> int:
        """Supervise until SIGTERM/SIGINT; a stop, clean or not, removes the work folder."""
        try:
            return await self._run()
        finally:
            # Issue 28: every stop left its kcoral-supervisor-* folder in /tmp; the child's
            # ready file is all it holds and the child is gone by now.
            shutil.rmtree(self.workdir, ignore_errors=True)

    async def _run(self) -> int:
        set_child_subreaper()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stopping.set)
        hangup = functools.partial(self.log.event, "token_reload_skipped", message=NODE_HANGUP)
        loop.add_signal_handler(signal.SIGHUP, hangup)
        if self.node_kind is None:
            loop.run_in_executor(None, probe_kind, self.settings).add_done_callback(self._probed)
        reporter = loop.create_task(self.report_loop())
        supervisor = loop.create_task(self.supervise())
        await self.stopping.wait()
        self.log.event("supervisor_stopping", node_id=self.config.node_id)
        supervisor.cancel()
        await asyncio.gather(supervisor, return_exceptions=True)
        self.healthy = False
        self.last_error = "KCoral Server is shutting down"
        self.report()
        await self.stop_child(None)  # drain: the child finishes its active requests
        self.last_error = SERVER_STOPPED  # the router reads the leave as planned
        self.report()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(reporter), 2.0)
        reporter.cancel()
        await asyncio.gather(reporter, return_exceptions=True)
        self.log.event("supervisor_stopped", node_id=self.config.node_id)
        return self.exit_code


def run_supervisor(settings: ServerSettings, argv: Sequence[str] | None = None) -> int:
    """Run the node supervisor until SIGTERM/SIGINT; ``argv`` are the ``kcoral server``
    arguments (default: ``sys.argv`` after ``server``)."""
    if not sys.platform.startswith("linux"):
        sys.stderr.write("kcoral server --router: routed deployments run on Linux only\n")
        return 1
    if argv is None:
        args = sys.argv[1:]
        argv = args[args.index("server") + 1 :] if "server" in args else args
    supervisor = Supervisor(settings, argv, os.environ)
    return asyncio.run(then_ignoring_stop_signals(supervisor.run()))
