"""``kcoral router`` options (ROUTER.md §11) as one frozen dataclass."""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kcoral_server.browser_guard import host_problem, origin_problem
from kcoral_server.identity import parse_tokens


@dataclass(frozen=True)
class RouterSettings:
    host: str = "127.0.0.1"
    port: int = 9000
    grpc_port: int | None = None
    status_check_interval_seconds: float = 1.0
    max_status_age_seconds: float = 5.0
    unhealthy_threshold: int = 3
    recovery_threshold: int = 2
    queue_wait_timeout_seconds: float = 1800.0
    max_queued_requests: int = 1024
    node_retention_seconds: float = 600.0
    max_request_bytes: int = 268435456
    node_token: str | None = None
    ready_file: Path | None = None
    auth_token: str | None = None  # the client token file's text (EXTENSIONS §6)
    allow_unauthenticated: bool = False
    allow_unauthenticated_nodes: bool = False
    # Browsers (EXTENSIONS §6): extra Origin / Host values a request may carry.
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()

    def __repr__(self) -> str:  # never show the tokens
        fields = dict(self.__dict__)
        for name in ("node_token", "auth_token"):
            fields[name] = None if fields[name] is None else "<redacted>"
        return "RouterSettings(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"


class SettingsError(ValueError):
    """An invalid option; the message names it."""


def _duration(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds")
    return value


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kcoral router",
        description="Route KCoral requests to GPU nodes that connect over gRPC.",
        allow_abbrev=False,
    )
    add = parser.add_argument
    add("--host", default="127.0.0.1", help="listen address (a literal IP address)")
    add("--port", type=int, default=9000, help="HTTP and gRPC port (0 = any free port)")
    add("--grpc-port", type=int, default=None, help="serve gRPC on its own port instead")
    add("--status-check-interval-seconds", type=_duration, default=1.0)
    add("--max-status-age-seconds", type=_duration, default=5.0)
    add("--unhealthy-threshold", type=int, default=3)
    add("--recovery-threshold", type=int, default=2)
    add("--queue-wait-timeout-seconds", type=_duration, default=1800.0)
    add("--max-queued-requests", type=int, default=1024)
    add("--node-retention-seconds", type=_duration, default=600.0)
    add("--max-request-bytes", type=int, default=268435456)
    add("--node-token", default=None, help="node token (prefer env KCORAL_NODE_TOKEN)")
    add(
        "--auth-token-file",
        default=None,
        help="file holding the client token (or env KCORAL_AUTH_TOKEN)",
    )
    add(
        "--allow-unauthenticated",
        action="store_true",
        help="listen on a non-loopback address without a client token",
    )
    add(
        "--allow-unauthenticated-nodes",
        action="store_true",
        help="accept nodes without a node token although the router listens off loopback "
        "or has a client token",
    )
    add(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let web pages from this origin call the router (repeatable; default none)",
    )
    add(
        "--allowed-host",
        action="append",
        default=[],
        metavar="HOST",
        help="accept this Host name without a client token besides loopback and the listen "
        "address (repeatable; default none)",
    )
    add("--ready-file", type=Path, default=None, help=argparse.SUPPRESS)
    return parser


def _client_token(path: str | None, env: Mapping[str, str]) -> str | None:
    """The client token: from ``--auth-token-file`` (stripped), else ``KCORAL_AUTH_TOKEN``."""
    if path is None:
        return env.get("KCORAL_AUTH_TOKEN") or None
    if not path:
        raise SettingsError("--auth-token-file must not be empty")
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise SettingsError(f"--auth-token-file cannot be read: {reason}") from None
    if not token:
        raise SettingsError("--auth-token-file is empty")
    try:
        parse_tokens(token)  # one bare token, or `NAME TOKEN [admin]` lines
    except ValueError as exc:
        raise SettingsError(f"--auth-token-file: {exc}") from None
    return token


def parse_router_args(
    argv: Sequence[str], environ: Mapping[str, str] | None = None
) -> RouterSettings:
    """Parse and validate; argparse errors exit 2, rule violations raise ``SettingsError``."""
    env = os.environ if environ is None else environ
    args = _build_parser().parse_args(list(argv))
    token = args.node_token if args.node_token is not None else env.get("KCORAL_NODE_TOKEN")
    if token is not None and token == "":
        raise SettingsError("--node-token must not be empty")
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
    if (
        token is None
        and (auth_token is not None or not address.is_loopback)
        and not args.allow_unauthenticated_nodes
    ):
        # ROUTER §3: a node receives client programs and answers them; anyone who can claim
        # to be one reads what clients send. Only a loopback router without client tokens
        # (one user, one machine) may go without a node token.
        raise SettingsError(
            "refusing to accept nodes without a node token on a router that listens off "
            "loopback or has a client token; set KCORAL_NODE_TOKEN (or --node-token), or "
            "pass --allow-unauthenticated-nodes"
        )
    for option, values, problem_of in (
        ("--allowed-origin", args.allowed_origin, origin_problem),
        ("--allowed-host", args.allowed_host, host_problem),
    ):
        for value in values:
            problem = problem_of(value)
            if problem:
                raise SettingsError(f"{option} {problem}")
    if not 0 <= args.port <= 65535:
        raise SettingsError("--port must be between 0 and 65535")
    if args.grpc_port is not None and not 0 <= args.grpc_port <= 65535:
        raise SettingsError("--grpc-port must be between 0 and 65535")
    positive = ("status_check_interval_seconds", "max_status_age_seconds")
    for name in positive:
        if getattr(args, name) <= 0:
            raise SettingsError(f"--{name.replace('_', '-')} must be > 0")
    for name in ("unhealthy_threshold", "recovery_threshold", "max_request_bytes"):
        if getattr(args, name) < 1:
            raise SettingsError(f"--{name.replace('_', '-')} must be >= 1")
    if args.queue_wait_timeout_seconds < 0:
        raise SettingsError("--queue-wait-timeout-seconds must be >= 0")
    if args.max_queued_requests < 0:
        raise SettingsError("--max-queued-requests must be >= 0")
    if args.node_retention_seconds <= args.max_status_age_seconds:
        raise SettingsError(
            "--node-retention-seconds must be greater than --max-status-age-seconds"
        )
    return RouterSettings(
        host=args.host,
        port=args.port,
        grpc_port=args.grpc_port,
        status_check_interval_seconds=args.status_check_interval_seconds,
        max_status_age_seconds=args.max_status_age_seconds,
        unhealthy_threshold=args.unhealthy_threshold,
        recovery_threshold=args.recovery_threshold,
        queue_wait_timeout_seconds=args.queue_wait_timeout_seconds,
        max_queued_requests=args.max_queued_requests,
        node_retention_seconds=args.node_retention_seconds,
        max_request_bytes=args.max_request_bytes,
        node_token=token,
        ready_file=args.ready_file,
        auth_token=auth_token,
        allow_unauthenticated=args.allow_unauthenticated,
        allow_unauthenticated_nodes=args.allow_unauthenticated_nodes,
        allowed_origins=tuple(args.allowed_origin),
        allowed_hosts=tuple(args.allowed_host),
    )
