"""``kcoral server``: resolve devices, start the pool, serve, and shut down gracefully.

Start-up order (SERVER §2, §12; EXTENSIONS §2, §6): parse and validate the options, refuse a
non-loopback address without a token, open the event log, check that the port is free,
probe the sandbox and the devices, start the pool (``pool_ready``), print ``Application
startup complete.``, listen, then print ``KCoral server listening on http://HOST:PORT`` and
write it to ``--ready-file``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import tornado.httpserver
import tornado.netutil

from kcoral_server.front_door.app import ServerState, create_app
from kcoral_server.front_door.callers import identity_count, token_file_exposure
from kcoral_server.front_door.token_reload import TokenReload
from kcoral_server.gpu.inventory import DeviceError, choose_devices
from kcoral_server.pool.startup import PoolStartError
from kcoral_server.processes.credentials import withheld_credentials, withheld_message
from kcoral_server.processes.open_files import raise_open_file_limit
from kcoral_server.processes.sandbox import (
    SandboxUnavailable,
    keep_from_programs,
    resolve_sandbox,
)
from kcoral_server.processes.stop_signals import then_ignoring_stop_signals
from kcoral_server.settings.command_line import (
    ServerSettings,
    listen_failure_hint,
    parse_server_args,
)
from kcoral_server.settings.config import config_for_log
from kcoral_server.settings.secret_flags import client_variable_hint, secret_flag_warnings
from kcoral_server.storage.event_log import EventLog
from kcoral_server.storage.ready_file import try_write_ready_file


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server until SIGTERM/SIGINT; returns the exit code."""
    server_argv = list(sys.argv[1:] if argv is None else argv)
    # Clients, worker pipes and memfds are all descriptors; the supervisor, the server and
    # the workers (which inherit it) take all the hard limit allows (issue 28).
    raise_open_file_limit()
    settings = parse_server_args(server_argv, os.environ)
    config = settings.config
    for warning in secret_flag_warnings("kcoral server", server_argv):
        sys.stderr.write(warning + "\n")
    if settings.supervisor is not None:
        # ROUTER.md §12: this process becomes the node supervisor; the server runs as its
        # child (`--node-child`), which serves and opens the slot tunnel below. Settings the
        # child would refuse stop the supervisor now, with the child's own message.
        try:
            from kcoral_server.node.supervisor import child_settings_problem, run_supervisor
        except ImportError as exc:  # a node speaks gRPC to its router: kcoral[server] lacks it
            sys.stderr.write(
                f"kcoral: missing dependency ({exc.name or exc}); a node of a router needs "
                "the router stack: pip install 'kcoral[router]'\n"
            )
            return 1

        problem = child_settings_problem(settings, server_argv, os.environ)
        if problem is not None:
            sys.stderr.write(f"kcoral server: {problem}\n")
            return 2
        # A --port taken now fails every child start alike: the supervisor restarted its
        # child with back-off for ever, and a Slurm node job held its allocation serving
        # nothing. Later starts keep the back-off (a stray may let the port go).
        taken = port_taken(settings.port, settings.host)
        if taken is not None:
            sys.stderr.write(cannot_listen_line(settings, taken))
            return 1
        return run_supervisor(settings, server_argv)
    router_secret = None
    slot_key = ""  # ROUTER §12: what this node child's slots present to the router
    if settings.node_child:
        # ROUTER §12: the supervisor's secrets arrive through a pipe, read before any worker
        # exists; this child holds no client token and serves only its tunnel.
        from kcoral_server.node.handover import HandoverError, read_secrets, tie_to_supervisor

        try:
            secrets = read_secrets(os.environ)
        except HandoverError as exc:
            sys.stderr.write(f"kcoral server: {exc}\n")
            return 2
        if not tie_to_supervisor(os.environ):
            sys.stderr.write("kcoral server: the node supervisor is gone\n")
            return 1
        config = replace(
            config, node_token=secrets.node_token, auth_token=None, auth_token_file=None
        )
        settings = replace(settings, config=config)
        router_secret = secrets.router_secret
        slot_key = secrets.slot_key
    try:
        token = config.read_auth_token()
    except ValueError as exc:
        sys.stderr.write(f"kcoral server: {exc}\n")
        return 2
    if (
        token is None
        and router_secret is None
        and not is_loopback(settings.host)
        and not config.allow_unauthenticated
    ):
        sys.stderr.write(
            f"kcoral server: refusing to listen on non-loopback address {settings.host} "
            "without a client token; set --auth-token-file or KCORAL_AUTH_TOKEN, or pass "
            "--allow-unauthenticated\n"
        )
        return 2
    # On a server several people reach, no program gets the operator's credentials
    # (processes/credentials.py): decided here, before any launcher or worker exists. Off
    # loopback without a client token (--allow-unauthenticated) anyone who reaches the port
    # is a caller, as a router's callers are.
    open_to_all = token is None and not is_loopback(settings.host)
    several = router_secret is not None or open_to_all
    identities = None if several else identity_count(token)
    withheld = withheld_credentials(os.environ, identities, config.worker_env_allow)
    if withheld:
        config = replace(config, worker_env_withheld=tuple(withheld))
        settings = replace(settings, config=config)
    if config.device == "gpu" and os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        sys.stderr.write(
            "kcoral server: warning: CUDA_VISIBLE_DEVICES does not restrict the server; "
            "workers are pinned by --gpus\n"
        )
    return asyncio.run(then_ignoring_stop_signals(_serve(settings, token, router_secret, slot_key)))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def probe_sandbox(sandbox: str, events: EventLog, readonly_paths: Sequence[Path] = ()) -> str:
    """``bubblewrap`` if ``bwrap`` works here, else ``none`` with a ``sandbox_disabled`` event
    (``kcoral_server.processes.sandbox.resolve_sandbox``)."""
    return resolve_sandbox(sandbox, readonly_paths, events)


def port_taken(port: int, host: str) -> OSError | None:
    """Why ``host:port`` cannot be listened on now, checked before the pool starts: a taken
    port failed only after every worker had started and "Application startup complete."
    was printed. The port is not held (it is bound again after the pool start, SERVER §12):
    a rare race is still caught there."""
    if port == 0:
        return None  # any free port
    try:
        sockets = tornado.netutil.bind_sockets(port, host)
    except OSError as exc:
        return exc
    for sock in sockets:
        sock.close()
    return None


def cannot_listen_line(settings: ServerSettings, exc: OSError) -> str:
    hint = listen_failure_hint(exc)
    said = f"kcoral server: cannot listen on {settings.host}:{settings.port}: {exc}"
    return f"{said}; {hint}\n" if hint else f"{said}\n"


def _cannot_listen(settings: ServerSettings, events: EventLog, exc: OSError) -> int:
    events.emit("server_start_failed", "ERROR", error=str(exc), traceback="")
    sys.stderr.write(cannot_listen_line(settings, exc))
    return 1


async def _serve(
    settings: ServerSettings,
    token: str | None,
    router_secret: str | None = None,
    slot_key: str = "",
) -> int:
    config = settings.config
    loop = asyncio.get_running_loop()
    events = EventLog(
        config.log_dir,
        console=config.log_console,
        log_programs=config.log_programs,
        log_programs_max_bytes=config.log_programs_max_bytes,
        log_events_max_bytes=config.log_events_max_bytes,
    )
    stop = asyncio.Event()
    stopping = StopRequest(stop)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.signalled, sig)
    # SIGHUP re-reads the token file (EXTENSIONS §6); it no longer ends the server.
    token_reload = TokenReload(config.auth_token_file)
    loop.add_signal_handler(signal.SIGHUP, token_reload.hangup)
    events.emit(
        "server_started",
        run_dir=str(events.run_dir) if events.run_dir else None,
        config=config_for_log(config),
    )
    taken = port_taken(settings.port, settings.host)
    if taken is not None:
        return _cannot_listen(settings, events, taken)
    # off the loop: an old run may hold many files; its outcome is an event of its own
    cleaning = loop.run_in_executor(None, events.remove_old_runs, config.log_runs_max)
    if token is None and router_secret is None and not is_loopback(settings.host):
        events.emit(
            "unauthenticated_access",
            "WARNING",
            host=settings.host,
            message="listening on a non-loopback address without client authentication",
        )
    elif token is None and router_secret is None and (hint := client_variable_hint(os.environ)):
        events.emit("unauthenticated_access", "WARNING", host=settings.host, message=hint)
    elif token is None and router_secret is None:
        # Loopback keeps web pages out (EXTENSIONS §6), not the machine's other users: on a
        # shared GPU box each of them could run programs as this server's user.
        events.emit(
            "unauthenticated_access",
            "INFO",
            host=settings.host,
            message="no client token: any local user can run programs as this server's user;"
            " on a shared machine, give --auth-token-file",
        )
    if config.worker_env_withheld:
        names = list(config.worker_env_withheld)
        message = withheld_message(names)
        events.emit("worker_env_withheld", "INFO", names=names, message=message)
    token_file = config.auth_token_file
    exposure = None if token_file is None else token_file_exposure(token_file)
    if exposure is not None:
        events.emit("token_file_open", "WARNING", message=exposure, path=str(token_file))
    state: ServerState | None = None
    # written after the pool starts: hidden from the sandboxes made once it exists (SERVER
    # §14; it holds only the URL, which no sandboxed program can reach: no network)
    keep_from_programs(settings.ready_file)
    try:
        sandbox = await loop.run_in_executor(
            None, probe_sandbox, config.sandbox, events, config.sandbox_readonly_paths
        )
        choice = await loop.run_in_executor(
            None,
            lambda: choose_devices(
                config.device,
                config.gpus,
                gpus_given=settings.gpus_given,
                fake_gpu_count=config.fake_gpu_count,
            ),
        )
        if choice.probe_problem:  # a GPU machine whose torch broke would run on the CPU unsaid
            events.emit(
                "gpu_probe_failed",
                "WARNING",
                message="--device auto could not ask CUDA for GPUs: programs run on the CPU",
                error=choice.probe_problem,
            )
        app = create_app(
            config,
            mode=choice.mode,
            gpus=choice.gpus,
            events=events,
            sandbox=sandbox,
            auth_token=token,
            listen_host=settings.host,
            router_secret=router_secret,
        )
        state = app.state
        token_reload.attach(state)
        await state.start()
    except SandboxUnavailable as exc:
        # An explicit --sandbox bubblewrap never degrades to running programs unconfined.
        events.emit("server_start_failed", "ERROR", error=str(exc), traceback="")
        sys.stderr.write(f"kcoral server: {exc}\n")
        return 2
    except (DeviceError, PoolStartError, OSError, ValueError) as exc:
        events.emit(
            "server_start_failed", "ERROR", error=str(exc), traceback=traceback.format_exc()
        )
        sys.stderr.write(f"kcoral server: start-up failed: {exc}\n")
        if state is not None:
            await state.stop()
        return 1
    stopping.started = True
    if stop.is_set():  # asked to stop during start-up: never listen
        await _shutdown(state, events)
        await cleaning
        events.emit("server_stopped")
        events.close()
        return 0
    sys.stderr.write("Application startup complete.\n")
    sys.stderr.flush()

    server = tornado.httpserver.HTTPServer(
        app,
        max_body_size=config.max_request_bytes + (1 << 20),
        # Tornado's only head deadline: the wait for each request head, counted from the
        # connection's start or its previous answer (also the keep-alive idle time, issue 28).
        idle_connection_timeout=config.request_head_timeout_seconds,
    )
    try:
        sockets = tornado.netutil.bind_sockets(settings.port, settings.host)
    except OSError as exc:  # taken since the check at the start
        await state.stop()
        return _cannot_listen(settings, events, exc)
    server.add_sockets(sockets)
    port = sockets[0].getsockname()[1]
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    url = f"http://{host}:{port}"
    sys.stderr.write(f"KCoral server listening on {url}\n")
    sys.stderr.flush()
    exit_code = 0
    if settings.ready_file is not None and (said := try_write_ready_file(settings.ready_file, url)):
        events.emit("server_start_failed", "ERROR", error=said, traceback="")
        sys.stderr.write(f"kcoral server: {said}\n")
        exit_code = 1
        stop.set()

    tunnel = None
    if settings.node_child:
        from kcoral_server.node.tunnel import start_tunnel

        tunnel = await start_tunnel(
            settings,
            url,
            len(state.pool.seats),
            events,
            instance_id=state.instance_id,
            server_secret=router_secret,
            slot_key=slot_key,
        )

    await stop.wait()
    if tunnel is not None:
        # SERVER §12.5: idle worker slots close at once, active ones deliver their response;
        # control slots stay while the server drains, for the jobs that end meanwhile.
        await asyncio.gather(_shutdown(state, events), tunnel.close_worker_slots())
        await tunnel.close()
    else:
        await _shutdown(state, events, stop_listening=server.stop)
    server.stop()
    await server.close_all_connections()
    await cleaning  # its event lands in this run's file, not after it closed
    events.emit("server_stopped")
    events.close()
    return exit_code


async def _shutdown(
    state: ServerState, events: EventLog, stop_listening: Callable[[], None] | None = None
) -> None:
    """SERVER §12: stop admitting, let running requests finish, close workers.
    ``stop_listening`` closes the listening socket once the drain is done (no tunnel's
    control slots to serve): the port is free while the workers close, which takes seconds."""
    pool = state.pool
    since = time.monotonic()
    state.shutting_down = True
    pool.begin_shutdown()
    remaining = _in_progress(state)
    events.emit("shutdown_started", remaining=remaining)
    sys.stderr.write(f"Shutdown requested. Finishing remaining benchmarks: {remaining} left.\n")
    sys.stderr.flush()
    seen = state.finished_requests
    while _in_progress(state) > 0 or state.open_requests > 0:
        try:
            await asyncio.wait_for(state.wait_request_done(), 1.0)
        except (asyncio.TimeoutError, TimeoutError):
            pass
        now_remaining = _in_progress(state)
        while seen < state.finished_requests:
            seen += 1
            events.emit("shutdown_waiting", remaining=now_remaining)
        if now_remaining != remaining:
            remaining = now_remaining
            sys.stderr.write(f"Finishing remaining benchmarks: {remaining} left.\n")
            sys.stderr.flush()
    # A job that ended just now (or during the drain) is read by its client right after its
    # last event: give that read a moment, or the client of a finished program lost its
    # result to the server's exit (always through a node, whose control slots then closed).
    unread = since - RESULT_GRACE_SECONDS
    deadline = time.monotonic() + RESULT_GRACE_SECONDS
    waiting = state.jobs.unread_results(unread)
    if waiting:
        # the seconds a stop can take here, said (an operator saw only a pause)
        events.emit("shutdown_awaiting_results", unread=waiting)
    while waiting and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        waiting = state.jobs.unread_results(unread)
    if stop_listening is not None:
        stop_listening()
    await state.stop()
    events.emit("shutdown_complete")


class StopRequest:
    """SIGTERM and SIGINT from the first moment of ``_serve`` (SERVER §12). During start-up
    (probing the sandbox and the GPUs, starting every worker: seconds on a GPU) a signal used
    to raise ``KeyboardInterrupt`` through ``asyncio.run``: a traceback, and the workers left
    to die with their parent. Now start-up ends and the server stops without listening; as
    after start-up, a repeated signal changes nothing."""

    def __init__(self, stop: asyncio.Event) -> None:
        self.stop = stop
        self.started = False

    def signalled(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if not self.started and not self.stop.is_set():
            sys.stderr.write(f"kcoral server: {name}: stopping once start-up ends\n")
            sys.stderr.flush()
        elif self.started and self.stop.is_set():
            # A second Ctrl-C during the drain printed nothing, as if the server hung.
            sys.stderr.write(
                f"kcoral server: {name} again: already stopping, once the running programs "
                "finish (each within its own deadline); repeated signals do not hurry it: "
                f"kill -KILL {os.getpid()} ends it now, and them with it\n"
            )
            sys.stderr.flush()
        self.stop.set()


def _in_progress(state: ServerState) -> int:
    """Programs running now: the pool's requests and the sessions' programs (a session's
    job has no open request to wait for, and its program would die with the session)."""
    return state.pool.requests_in_progress + state.sessions.programs_running


#: how long a draining server waits, once its work is done, for the results of jobs that
#: finished during the drain or this long before it to be read (SERVER §12 step 4)
RESULT_GRACE_SECONDS = 3.0
