"""``kcoral server`` command line: flags and environment -> ``ServerSettings``.

Precedence is flag > environment > default; every invalid setting ends in ``SystemExit(2)``
with a message naming the option (SERVER.md §2, EXTENSIONS.md §2/§6, ROUTER.md §12). The
configuration itself and its validation rules live in ``kcoral_server.config``.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

from kcoral_server.config import (
    InvalidConfigError,
    ServerConfig,
    flag_settings,
)

_INTEGER = re.compile(r"-?[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)


@dataclass(frozen=True)
class SupervisorOptions:
    """ROUTER.md §12 node-supervisor options (only with ``--router``)."""

    health_interval_seconds: float = 2.0
    health_timeout_seconds: float = 1.0
    failure_threshold: int = 3
    startup_grace_seconds: float = 30.0
    stable_reset_seconds: float = 60.0
    termination_grace_seconds: float = 5.0
    restart_min_delay_seconds: float = 1.0
    restart_max_delay_seconds: float = 30.0
    restart_jitter: float = 0.2


@dataclass(frozen=True)
class ServerSettings:
    """Everything ``kcoral server`` was asked for.

    ``supervisor`` is set when ``--router`` starts a node supervisor (not for the node child);
    ``gpus_given`` says whether ``--gpus``/``KCORAL_SERVER_GPUS`` was set, since in GPU mode
    the default is every visible GPU (EXTENSIONS.md §2).
    """

    config: ServerConfig
    host: str = "127.0.0.1"
    port: int = 8000
    ready_file: Path | None = None
    supervisor: SupervisorOptions | None = None
    node_child: bool = False
    gpus_given: bool = False


# hidden option -> SupervisorOptions field
_SUPERVISOR_OPTIONS = {
    "--health-interval-seconds": "health_interval_seconds",
    "--health-timeout-seconds": "health_timeout_seconds",
    "--failure-threshold": "failure_threshold",
    "--startup-grace-seconds": "startup_grace_seconds",
    "--stable-reset-seconds": "stable_reset_seconds",
    "--termination-grace-seconds": "termination_grace_seconds",
    "--restart-min-delay-seconds": "restart_min_delay_seconds",
    "--restart-max-delay-seconds": "restart_max_delay_seconds",
    "--restart-jitter": "restart_jitter",
}


def parse_integer(text: str) -> int:
    """A plain decimal integer (no unit suffixes, no underscores)."""
    if not _INTEGER.fullmatch(text):
        raise ValueError(f"not a plain integer: {text!r}")
    return int(text)


def parse_seconds(text: str) -> float:
    """A finite decimal number."""
    if not _DECIMAL.fullmatch(text):
        raise ValueError(f"not a decimal number: {text!r}")
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"not a finite number: {text!r}")
    return value


def parse_gpus(text: str) -> list[int]:
    """Comma-separated GPU ids; empty entries are skipped."""
    ids = []
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            continue
        if not entry.isascii() or not entry.isdigit():
            raise ValueError(f"not a GPU id: {entry!r}")
        ids.append(int(entry))
    return ids


def _arg_type(convert: Any, description: str) -> Any:
    def converter(text: str) -> Any:
        try:
            return convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {description}: {text!r}") from None

    converter.__name__ = description
    return converter


_INT = _arg_type(parse_integer, "integer")
_SECONDS = _arg_type(parse_seconds, "number of seconds")
_GPUS = _arg_type(parse_gpus, "GPU id list")
_NUMBER = _arg_type(parse_seconds, "number")
#: a ``setting``'s kind -> (argparse type, converter for its environment variable)
_KINDS = {
    "int": (_INT, parse_integer),
    "seconds": (_SECONDS, parse_seconds),
    "text": (None, str),
    "path": (None, str),  # made a Path once the empty-value rule has been applied
}


def _setting_help(setting: Field) -> str:
    """``--help`` text of a declared setting: its help, then "(default …)"."""
    meta = setting.metadata
    if meta["hidden"]:
        return argparse.SUPPRESS
    text = meta["help"] + ("; '' disables" if meta["empty"] == "disables" else "")
    if meta["kind"] == "switch":
        return text
    env = f"env {meta['env']}" if meta["env"] and meta["env_in_help"] else ""
    shown = meta["shown_default"]
    if shown is None:
        default = setting.default if meta["cli_default"] is MISSING else meta["cli_default"]
        assert default is not MISSING, f"{setting.name}: a factory default needs shown_default"
        if default is None:  # nothing to show: no default (or only the variable)
            return f"{text} ({env})" if env else text
        shown = f"{default:g}" if isinstance(default, float) else str(default)
    if not shown.startswith(":"):
        shown = " " + shown
    if env:
        shown += f"; {env}"
    return f"{text} (default{shown})".lstrip()


def build_server_parser() -> argparse.ArgumentParser:
    """The ``kcoral server`` parser. Every default is ``None`` so that precedence
    (flag > environment > default) can be resolved afterwards."""
    parser = argparse.ArgumentParser(
        prog="kcoral server",
        description="Run a KCoral server.",
        allow_abbrev=False,
    )
    metavars = {_INT: "N", _SECONDS: "SECONDS", _NUMBER: "X"}

    def add(option: str, **kwargs: Any) -> None:
        if "type" in kwargs and "metavar" not in kwargs:
            kwargs["metavar"] = metavars[kwargs["type"]]
        elif "action" not in kwargs and "metavar" not in kwargs:
            kwargs["metavar"] = "PATH" if option.endswith(("-file", "-dir", "-path")) else None
        parser.add_argument(option, **kwargs)

    hidden = argparse.SUPPRESS
    settings = {setting.name: setting for setting in flag_settings()}

    def add_setting(name: str) -> None:
        """A ``ServerConfig`` setting, as its declaration says (``config.setting``)."""
        setting = settings.pop(name)
        meta = setting.metadata
        options: dict[str, Any] = {"help": _setting_help(setting)}
        if meta["kind"] == "switch":
            options.update(action="store_true", default=None)
        elif _KINDS[meta["kind"]][0] is not None:
            options["type"] = _KINDS[meta["kind"]][0]
        if meta["metavar"] is not None:
            options["metavar"] = meta["metavar"]
        elif "action" not in options and "type" not in options:  # named after the flag
            flag = meta["flag"]
            options["metavar"] = "PATH" if flag.endswith(("-file", "-dir", "-path")) else None
            options["metavar"] = options["metavar"] or flag[2:].upper().replace("-", "_")
        add(meta["flag"], dest=name, **options)

    add("--host", help="listen address (default 127.0.0.1; env KCORAL_SERVER_HOST)")
    add("--port", type=_INT, help="port, 0 picks a free one (default 8000; env KCORAL_SERVER_PORT)")
    add("--ready-file", help="write the server URL to this file once it accepts requests")
    add_setting("device")
    add("--gpus", help="comma-separated physical GPU ids (default 0; env KCORAL_SERVER_GPUS)")
    add_setting("num_workers")
    add_setting("workers_per_gpu")
    add_setting("max_requests_per_worker")
    add_setting("worker_termination_grace_seconds")
    add_setting("worker_wait_timeout_seconds")
    add_setting("body_timeout_seconds")
    add_setting("default_timeout_seconds")
    add_setting("max_timeout_seconds")
    add_setting("max_request_bytes")
    add_setting("max_response_bytes")
    add_setting("output_limit_bytes")
    add_setting("max_output_limit_bytes")
    add_setting("cache_capacity_bytes")
    add_setting("disk_cache_dir")
    add_setting("disk_cache_capacity_mbytes")
    add_setting("log_dir")
    add_setting("log_console")
    add_setting("log_programs")
    add_setting("sandbox")
    add(
        "--sandbox-readonly-path",
        action="append",
        metavar="PATH",
        help="extra read-only path in the sandbox (repeatable)",
    )
    add_setting("router_endpoint")
    add_setting("node_id")
    add_setting("node_token")
    add_setting("auth_token_file")
    add_setting("allow_unauthenticated")
    add_setting("job_retention_seconds")
    add_setting("job_retention_bytes")
    add_setting("max_sessions")
    add_setting("session_idle_seconds")
    add_setting("max_inflight_request_bytes")
    add_setting("worker_memory_limit_bytes")
    add_setting("worker_process_limit")
    add(
        "--worker-env-deny",
        action="append",
        metavar="NAME",
        help="environment variable no worker inherits; NAME* denies a prefix (repeatable)",
    )
    add(
        "--allowed-origin",
        action="append",
        metavar="ORIGIN",
        help="let web pages from this origin call the server (repeatable; default none)",
    )
    add(
        "--allowed-host",
        action="append",
        metavar="HOST",
        help="accept this Host name without a client token besides loopback and the listen "
        "address (repeatable; default none)",
    )
    # Hidden: node-supervisor options (ROUTER.md §12), the supervisor's child entry point and
    # the test-only fake-GPU count.
    for option in _SUPERVISOR_OPTIONS:
        kind = _INT if option == "--failure-threshold" else _NUMBER
        add(option, type=kind, help=hidden)
    add("--node-child", action="store_true", default=None, help=hidden)
    add_setting("fake_gpu_count")
    assert not settings, f"declared settings without an option: {sorted(settings)}"
    return parser


class _Resolver:
    """Flag > environment > default, with messages that name where a bad value came from."""

    def __init__(self, parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
        self.parser = parser
        self.environ = environ

    def fail(self, message: str) -> NoReturn:
        self.parser.error(message)

    def env(self, name: str, *, empty_is_unset: bool = False) -> str | None:
        value = self.environ.get(name)
        if value is None or (empty_is_unset and value == ""):
            return None
        return value

    def pick(
        self, flag_value: Any, env_name: str, convert: Any, *, empty_is_unset: bool = False
    ) -> Any:
        if flag_value is not None:
            return flag_value
        raw = self.env(env_name, empty_is_unset=empty_is_unset)
        if raw is None:
            return None
        try:
            return convert(raw)
        except ValueError as exc:
            self.fail(f"{env_name}: {exc}")


def _identity(text: str) -> str:
    return text


def parse_server_args(argv: Sequence[str], environ: Mapping[str, str]) -> ServerSettings:
    """Parse ``kcoral server`` arguments. Invalid settings raise ``SystemExit(2)`` with a
    message on stderr; ``--help`` raises ``SystemExit(0)``."""
    parser = build_server_parser()
    args = parser.parse_args(list(argv))
    resolve = _Resolver(parser, environ)
    kwargs: dict[str, Any] = {}

    host = resolve.pick(args.host, "KCORAL_SERVER_HOST", _identity)
    host = "127.0.0.1" if host is None else host
    if not host:
        resolve.fail("--host must not be empty")
    port = resolve.pick(args.port, "KCORAL_SERVER_PORT", parse_integer)
    port = 8000 if port is None else port
    if not 0 <= port <= 65535:
        resolve.fail(f"--port must be in 0-65535 (got {port})")

    for setting in flag_settings():  # flag, else its environment variable, else default
        _resolve_setting(setting, getattr(args, setting.name), resolve, environ, kwargs)

    gpus_text = args.gpus if args.gpus is not None else resolve.env("KCORAL_SERVER_GPUS")
    gpus_given = gpus_text is not None
    if gpus_given:
        try:
            kwargs["gpus"] = parse_gpus(gpus_text)
        except ValueError as exc:
            if kwargs.get("device", "auto") != "cpu":  # ignored in CPU mode (SERVER.md §2)
                origin = "--gpus" if args.gpus is not None else "KCORAL_SERVER_GPUS"
                resolve.fail(f"{origin}: {exc}")
            kwargs["gpus"] = []

    kwargs["allowed_origins"] = list(args.allowed_origin or [])
    kwargs["allowed_hosts"] = list(args.allowed_host or [])
    kwargs["worker_env_deny"] = list(args.worker_env_deny or [])
    if args.sandbox_readonly_path:
        if any(not p for p in args.sandbox_readonly_path):
            resolve.fail("--sandbox-readonly-path must not be empty")
        kwargs["sandbox_readonly_paths"] = [Path(p) for p in args.sandbox_readonly_path]
    router = kwargs.get("router_endpoint")

    serialization = resolve.env("KCORAL_ALLOWED_SERIALIZATION", empty_is_unset=True)
    if serialization is not None:
        kwargs["allowed_serialization"] = [s.strip() for s in serialization.split(",") if s.strip()]

    if "auth_token_file" not in kwargs:
        token = resolve.env("KCORAL_AUTH_TOKEN", empty_is_unset=True)
        if token is not None:
            kwargs["auth_token"] = token

    try:
        config = ServerConfig(**kwargs)
        if config.auth_token_file is not None:
            # Read now: a missing token file must stop the server before anything starts.
            config = replace(config, auth_token=config.read_auth_token())
    except InvalidConfigError as exc:
        resolve.fail(exc.cli_message)
    except ValueError as exc:
        resolve.fail(str(exc))

    supervisor = _supervisor_options(args, resolve, router)
    node_child = bool(args.node_child)
    if node_child:
        if router is None:
            resolve.fail("--node-child requires --router")
        supervisor = None
    if router is not None and not sys.platform.startswith("linux"):
        resolve.fail("--router (routed deployments) needs Linux")

    ready_file = Path(args.ready_file) if args.ready_file else None
    return ServerSettings(
        config=config,
        host=host,
        port=port,
        ready_file=ready_file,
        supervisor=supervisor,
        node_child=node_child,
        gpus_given=gpus_given,
    )


def _resolve_setting(
    setting: Field,
    value: Any,
    resolve: _Resolver,
    environ: Mapping[str, str],
    kwargs: dict[str, Any],
) -> None:
    """Put a declared setting's value into ``kwargs``, or nothing for the field's default."""
    meta = setting.metadata
    if meta["kind"] == "switch":
        if value:  # a --no-... flag turns its setting off
            kwargs[setting.name] = not meta["flag"].startswith("--no-")
        return
    if value is None and meta["env"] is not None:
        convert = _KINDS[meta["kind"]][1]
        value = resolve.pick(None, meta["env"], convert, empty_is_unset=meta["env_empty_is_unset"])
    if value is None and meta["cli_default"] is not MISSING:
        default = meta["cli_default"]
        value = default(environ) if callable(default) else default
    if value == "" and meta["empty"] == "disables":
        kwargs[setting.name] = None
        return
    if value == "" and meta["empty"] == "refused":
        resolve.fail(f"{meta['flag']} must not be empty")
    if value is not None:
        kwargs[setting.name] = Path(value) if meta["kind"] == "path" else value


def _supervisor_options(
    args: argparse.Namespace, resolve: _Resolver, router: str | None
) -> SupervisorOptions | None:
    given = {
        option: getattr(args, name)
        for option, name in _SUPERVISOR_OPTIONS.items()
        if getattr(args, name) is not None
    }
    if router is None:
        if given:
            resolve.fail(f"{next(iter(given))} requires --router")
        return None
    options = SupervisorOptions(**{_SUPERVISOR_OPTIONS[o]: v for o, v in given.items()})
    for name in ("health_interval_seconds", "health_timeout_seconds"):
        if getattr(options, name) <= 0:
            resolve.fail(f"--{name.replace('_', '-')} must be > 0")
    for name in ("restart_min_delay_seconds", "restart_max_delay_seconds"):
        if getattr(options, name) <= 0:
            resolve.fail(f"--{name.replace('_', '-')} must be > 0")
    if options.failure_threshold < 1:
        resolve.fail("--failure-threshold must be >= 1")
    if options.restart_min_delay_seconds > options.restart_max_delay_seconds:
        resolve.fail("--restart-min-delay-seconds must be <= --restart-max-delay-seconds")
    for name in ("startup_grace_seconds", "stable_reset_seconds", "termination_grace_seconds"):
        if getattr(options, name) < 0:
            resolve.fail(f"--{name.replace('_', '-')} must be >= 0")
    if not 0 <= options.restart_jitter <= 0.5:
        resolve.fail("--restart-jitter must be in 0-0.5")
    return options
