"""``kcoral router``: parse options, start gRPC and HTTP, run until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import signal
import sys
import uuid
from collections.abc import Sequence

import grpc
import tornado.httpserver
import tornado.netutil
import tornado.tcpserver

from kcoral_server.processes.open_files import raise_open_file_limit
from kcoral_server.processes.stop_signals import then_ignoring_stop_signals
from kcoral_server.router.admission.scheduler import Admission, ControlAdmission
from kcoral_server.router.http_app import RouterState, make_app, utc_now_micros
from kcoral_server.router.identity import MAX_FRAME_DATA, MAX_GRPC_MESSAGE
from kcoral_server.router.listener import DemuxServer, unclassified_bound
from kcoral_server.router.log import NodeStateLines, RouterLog
from kcoral_server.router.nodes.gateway import Gateway, add_gateway_to_server
from kcoral_server.router.nodes.registry import STARTING, Registry
from kcoral_server.router.routes.session_index import node_back_handler
from kcoral_server.router.settings import RouterSettings, SettingsError, parse_router_args
from kcoral_server.settings.command_line import listen_failure_hint
from kcoral_server.settings.secret_flags import client_variable_hint, secret_flag_warnings
from kcoral_server.storage.ready_file import ready_file_problem, try_write_ready_file

GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE),
    ("grpc.max_send_message_length", MAX_GRPC_MESSAGE),
    ("grpc.keepalive_time_ms", 15000),
    ("grpc.keepalive_timeout_ms", 5000),
    ("grpc.http2.min_ping_interval_without_data_ms", 5000),
    ("grpc.keepalive_permit_without_calls", 1),
]
#: how long gRPC calls get to end once the router has ended them (``end_calls``); programs
#: being relayed get ``--stop-grace-seconds`` before that
CALLS_END_SECONDS = 1.0


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not sys.platform.startswith("linux"):
        sys.stderr.write("kcoral router: routed deployments run on Linux only\n")
        return 1
    try:
        settings = parse_router_args(args)
    except SettingsError as exc:
        sys.stderr.write(f"kcoral router: error: {exc}\n")
        return 2
    if settings.ready_file is not None and (problem := ready_file_problem(settings.ready_file)):
        sys.stderr.write(f"kcoral router: error: --ready-file {problem}\n")
        return 2
    for warning in secret_flag_warnings("kcoral router", args):
        sys.stderr.write(warning + "\n")
    return asyncio.run(then_ignoring_stop_signals(serve(settings)))


def build_state(settings: RouterSettings, log: RouterLog) -> RouterState:
    registry = Registry(settings)
    admission = Admission(
        registry, settings.max_queued_requests, settings.queue_wait_timeout_seconds
    )
    control = ControlAdmission(
        registry, settings.max_queued_requests, settings.queue_wait_timeout_seconds
    )

    def wake() -> None:
        admission.wake()
        control.wake()

    registry.on_change = wake
    state = RouterState(
        settings=settings,
        registry=registry,
        admission=admission,
        control=control,
        log=log,
        instance_id=str(uuid.uuid4()),
        started_at=utc_now_micros(),
    )
    for room in (admission, control):  # read at each request: a reload may change it
        room.identities = lambda: state.authenticator.identity_count

    def node_lost(node_id: str, why: str) -> None:
        state.sessions.node_lost(node_id, why)  # its sessions' state is gone
        state.jobs.node_lost(node_id, why)  # a new server holds none of its jobs

    registry.on_node_lost = node_lost
    registry.on_node_back = node_back_handler(state)  # it may still hold them: end them

    node_states = NodeStateLines(log, STARTING)

    def changed() -> None:
        if not admission.closed:  # a stopping router ends every stream: not the nodes' doing
            node_states(registry.nodes)
        wake()
        state.revocations.check_nodes()  # a node that (re)connected hears what it missed
        state.inventory.check_nodes()  # and, in the grace, says which sessions it holds

    registry.on_change = changed
    return state


async def requests_done(state: RouterState, seconds: float) -> None:
    """Wait until no program is being relayed (on a worker slot, or a session's), ``seconds``
    at most."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (state.in_progress > 0 or state.session_programs) and loop.time() < deadline:
        await asyncio.sleep(0.02)


def end_calls(registry: Registry) -> None:
    """The router stops: end every supervisor stream (status OK) and close every slot
    (``UNAVAILABLE``), so that no call is left for grpc to cancel at exit (it printed a
    ``CancelledError`` traceback for each after ``router_stopped``)."""
    for node in registry.nodes.values():
        if node.stream is not None:
            node.stream.end()
        for slot in list(node.slots.values()):
            slot.close((grpc.StatusCode.UNAVAILABLE, "router stopping"), "tunnel_disconnected")


async def serve(settings: RouterSettings) -> int:
    log = RouterLog()
    # From the first moment: a signal during start-up used to raise KeyboardInterrupt
    # through asyncio.run (a traceback, and grpc's unawaited shutdown); now the router
    # starts, then stops at once.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    # One descriptor per client, node and relay: take all the hard limit allows (issue 28).
    open_file_limit = raise_open_file_limit()
    state = build_state(settings, log)
    # SIGHUP re-reads the client tokens (EXTENSIONS §6); it no longer ends the router.
    loop.add_signal_handler(signal.SIGHUP, state.reload_tokens)
    grpc_server = grpc.aio.server(options=GRPC_OPTIONS)
    gateway = Gateway(state.registry, settings, log, on_status=state.metrics.node_status)
    add_gateway_to_server(gateway, grpc_server)
    if settings.grpc_port is not None:
        grpc_port = grpc_server.add_insecure_port(host_port(settings.host, settings.grpc_port))
    else:
        grpc_port = grpc_server.add_insecure_port("127.0.0.1:0")
    if grpc_port == 0:
        sys.stderr.write("kcoral router: error: could not bind the gRPC port\n")
        return 1
    await grpc_server.start()
    http_server = tornado.httpserver.HTTPServer(
        make_app(state),
        max_body_size=1 << 62,
        # Tornado's only head deadline: the wait for each request head, counted from the
        # connection's start or its previous answer (so also the keep-alive idle time). At
        # 3600 s each silent socket was the attacker's for an hour (issue 28).
        idle_connection_timeout=settings.request_head_timeout_seconds,
        # Read the body in whole 256 KiB frames: 4x fewer gRPC messages than the default.
        chunk_size=MAX_FRAME_DATA,
    )
    try:
        sockets = tornado.netutil.bind_sockets(settings.port, settings.host)
    except OSError as exc:
        hint = listen_failure_hint(exc)
        said = f"kcoral router: error: cannot listen on {settings.host}:{settings.port}: {exc}"
        sys.stderr.write(f"{said}; {hint}\n" if hint else f"{said}\n")
        await grpc_server.stop(0)
        return 1
    front: tornado.tcpserver.TCPServer  # HTTPServer is one too
    if settings.grpc_port is None:
        front = DemuxServer(
            http_server,
            grpc_port,
            classify_timeout_seconds=settings.request_head_timeout_seconds,
            max_unclassified=unclassified_bound(open_file_limit),
        )
        front.add_sockets(sockets)
    else:
        front = http_server
        http_server.add_sockets(sockets)
    port = sockets[0].getsockname()[1]
    url = f"http://{host_port(settings.host, port)}"
    log.event(
        "router_started",
        url=url,
        grpc=url if settings.grpc_port is None else f"http://{host_port(settings.host, grpc_port)}",
        instance_id=state.instance_id,
        node_token="set" if settings.node_token else None,
        node_tokens=len(settings.node_tokens.entries) if settings.node_tokens else None,
        client_token="set" if settings.auth_token else None,
    )
    if settings.auth_token_exposure is not None:
        # the --auth-token-file named on its command line
        log.event(
            "token_file_open",
            level="WARNING",
            message=settings.auth_token_exposure,
            path=settings.auth_token_file,
        )
    if settings.auth_token is None and not ipaddress.ip_address(settings.host).is_loopback:
        log.event(
            "unauthenticated_access",
            level="WARNING",
            host=settings.host,
            message="listening on a non-loopback address without client authentication",
        )
    elif settings.auth_token is None and (client_hint := client_variable_hint(os.environ)):
        host = settings.host
        log.event("unauthenticated_access", level="WARNING", host=host, message=client_hint)
    elif settings.auth_token is None:
        # Loopback keeps web pages out (EXTENSIONS §6), not the machine's other users, who
        # could then also serve as nodes: no node token is needed on loopback without one.
        log.event("unauthenticated_access", host=settings.host, message=loopback_exposure(settings))
    if (
        settings.node_token is None
        and settings.node_tokens is None
        and (settings.auth_token is not None or not ipaddress.ip_address(settings.host).is_loopback)
    ):
        log.event(
            "unauthenticated_nodes",
            level="WARNING",
            host=settings.host,
            message="accepting nodes without a node token (--allow-unauthenticated-nodes): "
            "anyone who reaches the gRPC port can act as a node and receive client programs",
        )
    sys.stderr.write(f"KCoral router listening on {url}\n")
    sys.stderr.flush()
    exit_code = 0
    if settings.ready_file is not None and (
        unwritten := try_write_ready_file(settings.ready_file, url)
    ):
        sys.stderr.write(f"kcoral router: {unwritten}\n")
        exit_code = 1
        stop.set()

    async def periodic() -> None:
        while True:
            await asyncio.sleep(settings.status_check_interval_seconds)
            state.registry.check()

    checker = loop.create_task(periodic())
    await stop.wait()
    log.event(
        "router_stopping",
        in_progress=state.in_progress + len(state.session_programs),
        stop_grace_seconds=settings.stop_grace_seconds,
    )
    checker.cancel()
    front.stop()
    state.admission.close()  # queued requests get 503 no_node: none holds the stop
    state.control.close()
    await requests_done(state, settings.stop_grace_seconds)
    end_calls(state.registry)  # what is still relayed then is cut, as grpc's grace did
    await grpc_server.stop(CALLS_END_SECONDS)
    with contextlib.suppress(Exception):
        await http_server.close_all_connections()
    log.event("router_stopped")
    return exit_code


def loopback_exposure(settings: RouterSettings) -> str:
    """What a loopback router without a client token lets the machine's other users do (at
    most the console's 120 characters)."""
    if settings.node_token is None and settings.node_tokens is None:
        return (
            "no client or node token: any local user can send programs here or serve as a"
            " node; set both on a shared machine"
        )
    return (
        "no client token: any local user can send programs through this router; on a shared"
        " machine, give --auth-token-file"
    )
