"""``kcoral router`` options (ROUTER.md §11) as one frozen dataclass."""

from __future__ import annotations

import argparse
import ipaddress
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kcoral_server.front_door.browser_guard import host_problem, origin_problem
from kcoral_server.front_door.callers import parse_tokens, token_file_exposure
from kcoral_server.front_door.token_file import (
    TokenFileError,
    cannot_read,
    read_client_tokens,
    read_token_text,
    refusal,
)
from kcoral_server.router.identity import (
    NodeTokens,
    node_token_clash,
    node_token_problem,
    parse_node_tokens,
)
from kcoral_server.settings.command_line import SIZES_NOTE, add_grouped_options
from kcoral_server.settings.config import bearer_token_problem, declared_settings, setting


@dataclass(frozen=True)
class RouterSettings:
    """Every ``kcoral router`` option, each declared once (``config.setting``: flag, kind,
    default, help); the parser and its ``--help`` are derived from the declarations."""

    host: str = setting(
        "127.0.0.1",
        flag="--host",
        kind="text",
        group="network",
        help="address to listen on (a literal IP address); off loopback a client token is required",
    )
    port: int = setting(
        9000,
        flag="--port",
        kind="int",
        group="network",
        help="port for clients (HTTP) and nodes (gRPC); 0 picks a free one",
    )
    grpc_port: int | None = setting(
        None,
        flag="--grpc-port",
        kind="int",
        group="network",
        help="serve the nodes' gRPC on this port of its own instead",
    )
    status_check_interval_seconds: float = setting(
        1.0,
        flag="--status-check-interval-seconds",
        kind="seconds",
        group="nodes",
        help="how often the router checks that each node's status is fresh",
    )
    max_status_age_seconds: float = setting(
        5.0,
        flag="--max-status-age-seconds",
        kind="seconds",
        group="nodes",
        help="a node whose last status is older gets no new requests",
    )
    # After a restart the router knows no job or session: a node that has not reconnected
    # yet (its back-off reaches 30 s, ±20 %, ROUTER §5) holds ids that are not gone (§13).
    reconnect_grace_seconds: float = setting(
        40.0,
        flag="--reconnect-grace-seconds",
        kind="seconds",
        group="nodes",
        help="for this long after the router starts, a job or session id no connected node "
        "knows is answered 503 (its node may not be back yet), not 404",
    )
    unhealthy_threshold: int = setting(
        3,
        flag="--unhealthy-threshold",
        kind="int",
        group="nodes",
        help="failed checks in a row before a node counts as unhealthy",
    )
    recovery_threshold: int = setting(
        2,
        flag="--recovery-threshold",
        kind="int",
        group="nodes",
        help="good checks in a row before an unhealthy node gets requests again",
    )
    queue_wait_timeout_seconds: float = setting(
        1800.0,
        flag="--queue-wait-timeout-seconds",
        kind="seconds",
        group="requests",
        help="how long a request waits for a free node before 503 no_node",
    )
    # A restart or an upgrade (systemd, a Kubernetes rollout) gives the router 30 s after
    # SIGTERM; with 1 s, every program running longer was cut (deploy soak).
    stop_grace_seconds: float = setting(
        20.0,
        flag="--stop-grace-seconds",
        kind="seconds",
        group="requests",
        help="on SIGTERM or SIGINT, how long programs being relayed may still finish (nothing "
        "new is taken meanwhile) before the router cuts them",
    )
    max_queued_requests: int = setting(
        1024,
        flag="--max-queued-requests",
        kind="int",
        group="requests",
        help="requests that may wait for a node; more get 503 router_busy",
    )
    node_retention_seconds: float = setting(
        600.0,
        flag="--node-retention-seconds",
        kind="seconds",
        group="nodes",
        help="how long a disconnected node stays listed",
    )
    # A node's slot streams each hold router memory and a place in its record; a rogue
    # node (or a node-token holder under its id) could open them without end. The default
    # is far above what a node opens (three per worker seat, ROUTER §5): 1,365 seats.
    max_slots_per_node: int = setting(
        4096,
        flag="--max-slots-per-node",
        kind="int",
        group="nodes",
        help="slot streams one node id may hold open; more are refused (RESOURCE_EXHAUSTED)",
        minimum=1,
    )
    max_request_bytes: int = setting(
        268435456,
        flag="--max-request-bytes",
        kind="bytes",
        group="requests",
        help="largest request body; a larger one is refused with 413",
    )
    # Issue 28: anyone who reaches the port can open connections; one that does not say what
    # it speaks, or send its request head, within this long is closed (also the keep-alive
    # idle time, which Tornado counts as the wait for the next head; clients drop theirs at
    # half of the default, kcoral.connection.keep_alive).
    request_head_timeout_seconds: float = setting(
        10.0,
        flag="--request-head-timeout-seconds",
        kind="seconds",
        group="network",
        help="close a connection that has not sent its protocol preface or a complete "
        "request head within this long of opening, or of its previous answer",
    )
    # resolved by hand: an empty KCORAL_NODE_TOKEN is refused, not unset (ROUTER §3)
    node_token: str | None = setting(
        None,
        flag="--node-token",
        kind="text",
        group="nodes",
        help="the token nodes must show (prefer env KCORAL_NODE_TOKEN)",
        secret=True,
    )
    # ROUTER §3: the per-node tokens read from --node-token-file (a file, like the client
    # token's, not a field), each opening only the node ids its line names: Slurm users who
    # each held the one shared token could otherwise take each other's node ids.
    node_tokens: NodeTokens | None = None
    # resolved by hand like node_token: an empty KCORAL_METRICS_TOKEN is unset, as on a server
    metrics_token: str | None = setting(
        None,
        flag="--metrics-token",
        kind="text",
        group="network",
        help="a token that reads /metrics and nothing else (for a scraper that should hold "
        "no client token); prefer env KCORAL_METRICS_TOKEN",
        secret=True,
    )
    ready_file: Path | None = setting(  # noqa: RUF009 (setting is a field)
        None, flag="--ready-file", kind="path", group="network", hidden=True
    )
    # the client token file's text (EXTENSIONS §6), read from --auth-token-file (not a field)
    auth_token: str | None = None
    # why that file is open to more people than it should be (``token_file_exposure``)
    auth_token_exposure: str | None = None
    # the --auth-token-file it was read from, for that warning's ``path`` (as the server's)
    auth_token_file: str | None = None
    allow_unauthenticated: bool = setting(
        False,
        flag="--allow-unauthenticated",
        kind="switch",
        group="network",
        help="listen on a non-loopback address without a client token",
    )
    allow_unauthenticated_nodes: bool = setting(
        False,
        flag="--allow-unauthenticated-nodes",
        kind="switch",
        group="nodes",
        help="accept nodes without a node token although the router listens off loopback "
        "or has a client token",
    )
    # Browsers (EXTENSIONS §6): extra Origin / Host values a request may carry.
    allowed_origins: tuple[str, ...] = setting(
        (),
        flag="--allowed-origin",
        kind="text",
        repeatable=True,
        group="network",
        metavar="ORIGIN",
        help="let web pages from this origin call the router",
    )
    allowed_hosts: tuple[str, ...] = setting(
        (),
        flag="--allowed-host",
        kind="text",
        repeatable=True,
        group="network",
        metavar="HOST",
        help="accept this Host name without a client token besides loopback and the listen address",
    )

    def __repr__(self) -> str:  # never show the tokens
        fields = dict(self.__dict__)
        for name in ("node_token", "auth_token", "metrics_token", "node_tokens"):
            fields[name] = None if fields[name] is None else "<redacted>"
        return "RouterSettings(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"


class SettingsError(ValueError):
    """An invalid option; the message names it."""


ROUTER_EXAMPLES = """\
examples:
  kcoral router                              127.0.0.1:9000, for nodes of this machine
  KCORAL_NODE_TOKEN=n0de kcoral router --host 0.0.0.0 --auth-token-file tokens.txt
  kcoral router --max-request-bytes 1G --queue-wait-timeout-seconds 600
  kcoral server --router http://127.0.0.1:9000 --node-id gpu-1   a node joins it
"""


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kcoral router",
        usage="%(prog)s [options]",
        description=f"Route KCoral requests to GPU nodes that connect over gRPC.\n\n{SIZES_NOTE}",
        epilog=ROUTER_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    sections = add_grouped_options(parser, declared_settings(RouterSettings))
    # A file, not a setting: the settings hold the token read from it.
    sections["network"].add_argument(
        "--auth-token-file",
        metavar="PATH",
        help=(
            "file of the client token(s) every request must carry: one token, or "
            "NAME TOKEN [admin] lines (or env KCORAL_AUTH_TOKEN); SIGHUP reads it again: a "
            "removed identity is refused and its work on the nodes cancelled"
        ),
    )
    sections["nodes"].add_argument(
        "--node-token-file",
        metavar="PATH",
        help="file of per-node tokens, lines 'NODE_ID TOKEN' ('PREFIX* TOKEN': every id with "
        "that prefix); a token opens only its own node ids; mode 0600 or stricter",
    )
    return parser


def _given_or_default(args: argparse.Namespace) -> None:
    """Every declared option left out takes its declared default (lists become tuples)."""
    for declared in declared_settings(RouterSettings):
        value = getattr(args, declared.name)
        if value is None:
            value = declared.default
        elif declared.metadata["repeatable"]:
            value = tuple(value)
        elif declared.metadata["kind"] == "path":
            value = Path(value) if value else None
        setattr(args, declared.name, value)


def _client_token(path: str | None, env: Mapping[str, str]) -> str | None:
    """The client token: from ``--auth-token-file`` (as a server reads it: one reader, one
    set of rules, ``front_door.token_file``), else ``KCORAL_AUTH_TOKEN``."""
    if path is not None:
        try:
            return read_client_tokens(_given_path("--auth-token-file", path)).text
        except TokenFileError as exc:
            raise SettingsError(refusal("--auth-token-file", path, exc)) from None
    token = env.get("KCORAL_AUTH_TOKEN") or None
    if token is not None:
        try:
            parse_tokens(token)  # one bare token, or `NAME TOKEN [admin]` lines
        except ValueError as exc:
            raise SettingsError(f"KCORAL_AUTH_TOKEN: {exc}") from None
    return token


def _given_path(flag: str, path: str) -> str:
    """``path`` if given (an empty one is no file: it must not read the current folder)."""
    if not path:
        raise SettingsError(f"{flag} must not be empty")
    return path


def _node_tokens(path: str | None) -> NodeTokens | None:
    """The per-node tokens of ``--node-token-file`` (ROUTER §3), refused where others may
    read or write the file or its group may write it: whoever reads it may act as any node
    it lists, and whoever writes it may add a node of their own. Its group may read it, as
    the client-token file's: a Kubernetes Secret is mounted root-owned, 0440, for the pod's
    ``fsGroup``, the only way a router that is not root reads it."""
    if path is None:
        return None
    given = _given_path("--node-token-file", path)
    try:
        mode = os.stat(given).st_mode
        text = read_token_text(given)
    except OSError as exc:
        raise SettingsError(f"--node-token-file {cannot_read(exc)}") from None
    except TokenFileError as exc:
        raise SettingsError(f"--node-token-file {exc}") from None
    if mode & 0o027:
        raise SettingsError(
            f"--node-token-file {path} is open to others or its group may write it (mode "
            f"{stat.S_IMODE(mode):04o}); make it readable by the router's user only: "
            f"chmod 600 {path}"
        )
    try:
        return parse_node_tokens(text)
    except ValueError as exc:
        raise SettingsError(f"--node-token-file: {exc}") from None


def parse_router_args(
    argv: Sequence[str], environ: Mapping[str, str] | None = None
) -> RouterSettings:
    """Parse and validate; argparse errors exit 2, rule violations raise ``SettingsError``."""
    env = os.environ if environ is None else environ
    args = _build_parser().parse_args(list(argv))
    _given_or_default(args)
    token = args.node_token if args.node_token is not None else env.get("KCORAL_NODE_TOKEN")
    if token is not None and (problem := node_token_problem(token)):
        origin = "--node-token" if args.node_token is not None else "KCORAL_NODE_TOKEN"
        raise SettingsError(f"{origin} {problem}")
    # As a server reads it: an empty KCORAL_METRICS_TOKEN is unset (a unit file's
    # ``KCORAL_METRICS_TOKEN=`` stopped a router that its server beside it started with),
    # an empty --metrics-token is refused as empty.
    metrics_token = (
        args.metrics_token
        if args.metrics_token is not None
        else env.get("KCORAL_METRICS_TOKEN") or None
    )
    if args.metrics_token == "":
        raise SettingsError("--metrics-token must not be empty")
    # The server's rule (EXTENSIONS §13): a scraper sends it in a header, which carries no
    # inner space, control character or non-ASCII letter ('a b' started a router no
    # scraper could read).
    if metrics_token is not None and (problem := bearer_token_problem(metrics_token)):
        origin = "--metrics-token" if args.metrics_token is not None else "KCORAL_METRICS_TOKEN"
        raise SettingsError(f"{origin} {problem}")
    try:
        address = ipaddress.ip_address(args.host)
    except ValueError:
        raise SettingsError(f"--host must be a literal IP address, got {args.host!r}") from None
    auth_token = _client_token(args.auth_token_file, env)
    if auth_token is None and not address.is_loopback and not args.allow_unauthenticated:
        raise SettingsError(
            f"refusing to listen on non-loopback address {args.host} without a client token; "
            "set --auth-token-file or KCORAL_AUTH_TOKEN, or pass --allow-unauthenticated"
        )
    node_tokens = _node_tokens(args.node_token_file)
    if auth_token is not None:
        clash = node_token_clash(parse_tokens(auth_token), token, node_tokens)
        if clash is not None:
            origin = "KCORAL_AUTH_TOKEN:" if args.auth_token_file is None else "--auth-token-file"
            raise SettingsError(f"{origin} {clash}")
    if (
        token is None
        and node_tokens is None
        and (auth_token is not None or not address.is_loopback)
        and not args.allow_unauthenticated_nodes
    ):
        # ROUTER §3: a node receives client programs and answers them; anyone who can claim
        # to be one reads what clients send. Only a loopback router without client tokens
        # (one user, one machine) may go without a node token.
        raise SettingsError(
            "refusing to accept nodes without a node token on a router that listens off "
            "loopback or has a client token; set KCORAL_NODE_TOKEN (or --node-token, or "
            "per-node tokens with --node-token-file), or "
            "pass --allow-unauthenticated-nodes"
        )
    for option, values, problem_of in (
        ("--allowed-origin", args.allowed_origins, origin_problem),
        ("--allowed-host", args.allowed_hosts, host_problem),
    ):
        for value in values:
            problem = problem_of(value)
            if problem:
                raise SettingsError(f"{option} {problem}")
    if not 0 <= args.port <= 65535:
        raise SettingsError("--port must be between 0 and 65535")
    if args.grpc_port is not None and not 0 <= args.grpc_port <= 65535:
        raise SettingsError("--grpc-port must be between 0 and 65535")
    positive = (
        "status_check_interval_seconds",
        "max_status_age_seconds",
        "request_head_timeout_seconds",
    )
    for name in positive:
        if getattr(args, name) <= 0:
            raise SettingsError(f"--{name.replace('_', '-')} must be > 0")
    for name in ("unhealthy_threshold", "recovery_threshold", "max_request_bytes"):
        if getattr(args, name) < 1:
            raise SettingsError(f"--{name.replace('_', '-')} must be >= 1")
    for bounded in declared_settings(RouterSettings):  # a declared bound (--max-slots-per-node)
        minimum = bounded.metadata["minimum"]
        if minimum is not None and getattr(args, bounded.name) < minimum:
            raise SettingsError(f"{bounded.metadata['flag']} must be >= {minimum}")
    for name in ("queue_wait_timeout_seconds", "reconnect_grace_seconds", "stop_grace_seconds"):
        if getattr(args, name) < 0:
            raise SettingsError(f"--{name.replace('_', '-')} must be >= 0")
    if args.max_queued_requests < 0:
        raise SettingsError("--max-queued-requests must be >= 0")
    if args.node_retention_seconds <= args.max_status_age_seconds:
        raise SettingsError(
            "--node-retention-seconds must be greater than --max-status-age-seconds"
        )
    declared = {
        option.name: getattr(args, option.name) for option in declared_settings(RouterSettings)
    }
    return RouterSettings(
        **{
            **declared,
            "node_token": token,
            "node_tokens": node_tokens,
            "auth_token": auth_token,
            "auth_token_exposure": (
                None if args.auth_token_file is None else token_file_exposure(args.auth_token_file)
            ),
            "auth_token_file": args.auth_token_file,
            "metrics_token": metrics_token,
        }
    )
