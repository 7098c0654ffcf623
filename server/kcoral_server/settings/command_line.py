"""``kcoral server`` command line: flags and environment -> ``ServerSettings``.

Precedence is flag > environment > default; every invalid setting ends in ``SystemExit(2)``
with a message naming the option (SERVER.md §2, EXTENSIONS.md §2/§6, ROUTER.md §12). The
configuration itself and its validation rules live in ``kcoral_server.settings.config``.
"""

from __future__ import annotations

import argparse
import errno
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, replace
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from kcoral.protocol.sizes import SIZE_UNITS_TEXT, parse_bytes
from kcoral_server.execution.serialization import ENV_VAR as SERIALIZATION_ENV_VAR
from kcoral_server.execution.serialization import allowed_serialization
from kcoral_server.front_door.callers import parse_tokens
from kcoral_server.processes.sandbox import SandboxError, check_readonly_paths
from kcoral_server.settings.config import (
    SETTING_GROUPS,
    InvalidConfigError,
    ServerConfig,
    declared_settings,
    flag_settings,
    setting,
)
from kcoral_server.storage.ready_file import ready_file_problem

T = TypeVar("T")
_INTEGER = re.compile(r"-?[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)


@dataclass(frozen=True)
class SupervisorOptions:
    """ROUTER.md §12 node-supervisor options (only with ``--router``; listed by ``--help``
    in its "router and node" group, where an operator following the scaling guide looks)."""

    health_interval_seconds: float = setting(
        2.0,
        flag="--health-interval-seconds",
        kind="seconds",
        group="router",
        help="with --router: how often the supervisor probes its server",
    )
    health_timeout_seconds: float = setting(
        1.0,
        flag="--health-timeout-seconds",
        kind="seconds",
        group="router",
        help="with --router: how long one probe of the server may take",
    )
    failure_threshold: int = setting(
        3,
        flag="--failure-threshold",
        kind="int",
        group="router",
        help="with --router: failed probes in a row before the server is restarted",
    )
    startup_grace_seconds: float = setting(
        30.0,
        flag="--startup-grace-seconds",
        kind="seconds",
        group="router",
        help="with --router: probe failures ignored this long after a (re)start",
    )
    stable_reset_seconds: float = setting(
        60.0,
        flag="--stable-reset-seconds",
        kind="seconds",
        group="router",
        help="with --router: healthy time that resets the restart delay",
    )
    termination_grace_seconds: float = setting(
        5.0,
        flag="--termination-grace-seconds",
        kind="seconds",
        group="router",
        help="with --router: SIGTERM to SIGKILL when an unhealthy server is killed",
    )
    restart_min_delay_seconds: float = setting(
        1.0,
        flag="--restart-min-delay-seconds",
        kind="seconds",
        group="router",
        help="with --router: the first restart delay",
    )
    restart_max_delay_seconds: float = setting(
        30.0,
        flag="--restart-max-delay-seconds",
        kind="seconds",
        group="router",
        help="with --router: the restart delay's cap (it doubles)",
    )
    restart_jitter: float = setting(
        0.2,
        flag="--restart-jitter",
        kind="number",
        group="router",
        help="with --router: the +/- share of each delay drawn at random, 0-0.5",
    )
    # How often the child's /metrics text goes up the status stream (EXTENSIONS §13); 0: never.
    metrics_interval_seconds: float = setting(
        15.0,
        flag="--metrics-interval-seconds",
        kind="seconds",
        group="router",
        help="with --router: how often the server's /metrics goes to the router; 0: never",
    )

    def __post_init__(self) -> None:
        for name in (
            "health_interval_seconds",
            "health_timeout_seconds",
            "restart_min_delay_seconds",
            "restart_max_delay_seconds",
        ):
            if getattr(self, name) <= 0:
                raise InvalidConfigError(name, "must be > 0")
        if self.failure_threshold < 1:
            raise InvalidConfigError("failure_threshold", "must be >= 1")
        if self.restart_min_delay_seconds > self.restart_max_delay_seconds:
            raise InvalidConfigError(
                "restart_min_delay_seconds", "must be <= --restart-max-delay-seconds"
            )
        for name in (
            "startup_grace_seconds",
            "stable_reset_seconds",
            "termination_grace_seconds",
            "metrics_interval_seconds",
        ):
            if getattr(self, name) < 0:
                raise InvalidConfigError(name, "must be >= 0")
        if not 0 <= self.restart_jitter <= 0.5:
            raise InvalidConfigError("restart_jitter", "must be in 0-0.5")


def supervisor_flags() -> list[str]:
    """The options that only a node supervisor takes (it strips them for its child)."""
    return [option.metadata["flag"] for option in declared_settings(SupervisorOptions)]


def listen_flags() -> list[str]:
    """``--host``, ``--port`` and ``--ready-file``: where this server listens and says so."""
    return [option.metadata["flag"] for option in declared_settings(ServerSettings)]


@dataclass(frozen=True)
class ServerSettings:
    """Everything ``kcoral server`` was asked for.

    ``supervisor`` is set when ``--router`` starts a node supervisor (not for the node child);
    ``gpus_given`` says whether ``--gpus``/``KCORAL_SERVER_GPUS`` was set, since in GPU mode
    the default is every visible GPU (EXTENSIONS.md §2).
    """

    config: ServerConfig
    host: str = setting(
        "127.0.0.1",
        flag="--host",
        kind="text",
        group="network",
        help="address to listen on; off loopback a client token is required",
        env="KCORAL_SERVER_HOST",
        empty="refused",
    )
    port: int = setting(
        8000,
        flag="--port",
        kind="int",
        group="network",
        help="port to listen on; 0 picks a free one",
        env="KCORAL_SERVER_PORT",
    )
    ready_file: Path | None = setting(  # noqa: RUF009 (setting is a field)
        None,
        flag="--ready-file",
        kind="path",
        group="network",
        help="write the server URL to this file once it accepts requests",
        empty="disables",
    )
    supervisor: SupervisorOptions | None = None
    node_child: bool = False
    gpus_given: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise InvalidConfigError("port", f"must be in 0-65535 (got {self.port})")


def listen_failure_hint(exc: OSError) -> str:
    """What to do when the listening socket cannot be bound, for the two causes a person
    meets first (``--port`` taken, ``--host`` not an address here), else ``""``: the
    system's words alone ("Address already in use") said neither."""
    if exc.errno == errno.EADDRINUSE:
        return (
            "another process listens there (a server already running?): stop it, or choose "
            "another --port (0 picks a free one)"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return "--host must be one of this machine's addresses (ip address lists them)"
    return ""


def parse_integer(text: str) -> int:
    """A plain decimal integer (no unit suffixes, no underscores)."""
    if not _INTEGER.fullmatch(text):
        raise ValueError(f"not a plain integer: {text!r}")
    return int(text)


def format_bytes(size: int) -> str:
    """A size for ``--help``: in the largest binary unit that divides it (``256 MiB``),
    else in bytes."""
    for suffix, unit in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size and size % unit == 0:
            return f"{size // unit} {suffix}"
    return f"{size} bytes" if size != 0 else "0"


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


def _arg_type(convert: Callable[[str], T], description: str, hint: str = "") -> Callable[[str], T]:
    """An argparse type; ``hint`` says what the value may be (``1GB`` read only 'invalid
    size', though the help's units note is far above the error)."""

    def converter(text: str) -> T:
        try:
            return convert(text)
        except ValueError:
            said = f"invalid {description}: {text!r}" + (f" ({hint})" if hint else "")
            raise argparse.ArgumentTypeError(said) from None

    converter.__name__ = description
    return converter


_INT = _arg_type(parse_integer, "integer")
_BYTES = _arg_type(parse_bytes, "size", SIZE_UNITS_TEXT)
_SECONDS = _arg_type(parse_seconds, "number of seconds")
_GPUS = _arg_type(parse_gpus, "GPU id list")
_NUMBER = _arg_type(parse_seconds, "number")
#: a ``setting``'s kind -> (argparse type, converter of its text from the environment, or
#: from the flag where the argparse type is None)
_KINDS: dict[str, tuple[Callable[[str], Any] | None, Callable[[str], Any]]] = {
    "int": (_INT, parse_integer),
    "bytes": (_BYTES, parse_bytes),
    "seconds": (_SECONDS, parse_seconds),
    "number": (_NUMBER, parse_seconds),
    "text": (None, str),
    "path": (None, str),  # made a Path once the empty-value rule has been applied
    # parsed after argparse: a bad list is an error only outside CPU mode (SERVER.md §2)
    "gpu_ids": (None, parse_gpus),
}
_METAVARS: dict[Callable[[str], Any] | None, str] = {
    _INT: "N",
    _BYTES: "SIZE",
    _SECONDS: "SECONDS",
    _NUMBER: "X",
}


def setting_help(declared: Field) -> str:
    """``--help`` text of a declared setting: its help, then "(default …)"."""
    meta = declared.metadata
    if meta["hidden"]:
        return argparse.SUPPRESS
    default = declared.default if meta["cli_default"] is MISSING else meta["cli_default"]
    # '' disables: said only where there is a default to disable
    disables = meta["empty"] == "disables" and default is not None
    text = meta["help"] + ("; '' disables" if disables else "")
    if meta["kind"] == "switch":
        return text
    if meta["repeatable"]:
        return f"{text} (repeatable; default none)"
    env = f"env {meta['env']}" if meta["env"] and meta["env_in_help"] else ""
    shown = meta["shown_default"]
    if shown is None:
        assert default is not MISSING, f"{declared.name}: a factory default needs shown_default"
        if default is None:  # nothing to show: no default (or only the variable)
            return f"{text} ({env})" if env else text
        if meta["kind"] == "bytes":
            shown = format_bytes(default)
        else:
            shown = f"{default:g}" if isinstance(default, float) else str(default)
    if not shown.startswith(":"):
        shown = " " + shown
    if env:
        shown += f"; {env}"
    return f"{text} (default{shown})".lstrip()


def add_setting_option(parser: Any, declared: Field) -> None:
    """The argparse option of a declared setting, as its declaration says."""
    meta = declared.metadata
    flag = meta["flag"]
    options: dict[str, Any] = {"dest": declared.name, "help": setting_help(declared)}
    if meta["kind"] == "switch":
        options.update(action="store_true", default=None)
    else:
        if meta["repeatable"]:
            options["action"] = "append"
        argparse_type = _KINDS[meta["kind"]][0]
        if argparse_type is not None:
            options["type"] = argparse_type
        # named after its kind, else after the flag
        metavar = meta["metavar"] or _METAVARS.get(argparse_type)
        if metavar is None and flag.endswith(("-file", "-dir", "-path")):
            metavar = "PATH"
        options["metavar"] = metavar or flag[2:].upper().replace("-", "_")
    parser.add_argument(flag, **options)


def add_grouped_options(
    parser: argparse.ArgumentParser, declared: Sequence[Field]
) -> dict[str, Any]:
    """One argparse option per declared setting, each in its declared group's section of
    ``--help`` (groups in ``SETTING_GROUPS`` order, options in declaration order; a group
    whose options are all hidden is left out). The sections made, by group key."""
    sections: dict[str, Any] = {}
    for key, title in SETTING_GROUPS.items():
        if any(d.metadata["group"] == key and not d.metadata["hidden"] for d in declared):
            sections[key] = parser.add_argument_group(title)
    for one in declared:
        add_setting_option(sections.get(one.metadata["group"], parser), one)
    return sections


# Both commands' --help: pre-wrapped (RawDescriptionHelpFormatter keeps the examples' lines).
SIZES_NOTE = """\
Sizes take K, M, G or T (KiB, MiB, GiB, TiB) or plain bytes: 256M, 4G, 268435456.
An option with an env variable reads it when the option is not given."""

SERVER_EXAMPLES = """\
examples:
  kcoral server                                 GPU if CUDA works, else CPU; 127.0.0.1:8000
  kcoral server --device cpu --num-workers 4    four CPU workers
  kcoral server --gpus 0,1 --workers-per-gpu 4  GPUs 0 and 1, four workers each
  kcoral server --max-request-bytes 1G --max-response-bytes 512M
  KCORAL_AUTH_TOKEN=s3cret kcoral server --host 0.0.0.0
  kcoral server --router http://router:9000 --node-id gpu-1   a node of a router
"""


def build_server_parser() -> argparse.ArgumentParser:
    """The ``kcoral server`` parser: one option per declared setting (``config.setting``),
    grouped as declared, the listen settings first. Every default is ``None`` so that
    precedence (flag > environment > default) can be resolved afterwards."""
    parser = argparse.ArgumentParser(
        prog="kcoral server",
        usage="%(prog)s [options]",
        description=f"Run a KCoral server.\n\n{SIZES_NOTE}",
        epilog=SERVER_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    add_grouped_options(
        parser,
        [
            *declared_settings(ServerSettings),
            *flag_settings(),
            *declared_settings(SupervisorOptions),
        ],
    )
    # The supervisor's child entry point (ROUTER.md §12): not a setting, never typed by hand.
    parser.add_argument("--node-child", action="store_true", default=None, help=argparse.SUPPRESS)
    return parser


class _Resolver:
    """Flag > environment > default, with messages that name where a bad value came from."""

    def __init__(self, parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
        self.parser = parser
        self.environ = environ
        #: field -> the environment variable its value came from (no flag was given)
        self.from_env: dict[str, str] = {}

    def fail(self, message: str) -> NoReturn:
        self.parser.error(message)

    def refuse(self, exc: InvalidConfigError) -> NoReturn:
        """Fail with ``exc``'s message, naming the variable a bad value came from: an
        operator who set ``KCORAL_SERVER_PORT`` read about a ``--port`` never typed."""
        origin = self.from_env.get(exc.field)
        self.fail(f"{exc.cli_message} (from {origin})" if origin else exc.cli_message)

    def env(self, name: str, *, empty_is_unset: bool = False) -> str | None:
        value = self.environ.get(name)
        if value is None or (empty_is_unset and value == ""):
            return None
        return value

    def settings(self, owner: Any, args: argparse.Namespace) -> dict[str, Any]:
        """Keyword arguments for dataclass ``owner`` from its declared settings: only those
        given (flag, variable or the command line's own default), so that the others keep
        the field's default."""
        values: dict[str, Any] = {}
        for declared in declared_settings(owner):
            self._resolve(declared, getattr(args, declared.name), values)
        return values

    def _resolve(self, declared: Field, value: Any, values: dict[str, Any]) -> None:
        meta = declared.metadata
        name, flag, kind = declared.name, meta["flag"], meta["kind"]
        if kind == "switch":
            if value:  # a --no-... flag turns its setting off
                values[name] = not flag.startswith("--no-")
            return
        if meta["repeatable"]:
            if value is not None:
                if meta["empty"] == "refused" and "" in value:
                    self.fail(f"{flag} must not be empty")
                values[name] = [Path(v) for v in value] if kind == "path" else list(value)
            return
        origin = flag
        if value is None and meta["env"] is not None:
            value = self.env(meta["env"], empty_is_unset=meta["env_empty_is_unset"])
            origin = meta["env"]
            if value is not None:
                self.from_env[name] = origin
            if value is not None and _KINDS[kind][0] is not None:  # what the flag's type does
                value = self._convert(value, kind, origin, values)
        if value is None and meta["cli_default"] is not MISSING:
            default = meta["cli_default"]
            value = default(self.environ) if callable(default) else default
        if value == "" and meta["empty"] == "disables":
            values[name] = None
            return
        if value == "" and meta["empty"] == "refused":
            self.fail(f"{origin} must not be empty")
        if isinstance(value, str) and _KINDS[kind][0] is None:
            value = self._convert(value, kind, origin, values)
        if value is not None:
            values[name] = Path(value) if kind == "path" else value

    def _convert(self, text: str, kind: str, origin: str, values: dict[str, Any]) -> Any:
        try:
            return _KINDS[kind][1](text)
        except ValueError as exc:
            if kind == "gpu_ids" and values.get("device") == "cpu":
                return []  # GPU ids are ignored in CPU mode (SERVER.md §2)
            self.fail(f"{origin}: {exc}")


def parse_server_args(argv: Sequence[str], environ: Mapping[str, str]) -> ServerSettings:
    """Parse ``kcoral server`` arguments. Invalid settings raise ``SystemExit(2)`` with a
    message on stderr; ``--help`` raises ``SystemExit(0)``.

    Every option is a declared setting; what a declaration cannot say stays here:
    ``KCORAL_AUTH_TOKEN`` (a variable that gives ``auth_token`` itself, and only without
    ``--auth-token-file``), ``KCORAL_ALLOWED_SERIALIZATION`` (a variable with no flag,
    EXTENSIONS §4), the supervisor's options (only with ``--router``), ``--node-child``
    (the supervisor's child) and the rule that routed deployments need Linux."""
    parser = build_server_parser()
    args = parser.parse_args(list(argv))
    resolve = _Resolver(parser, environ)
    listen = resolve.settings(ServerSettings, args)
    kwargs = resolve.settings(ServerConfig, args)
    router = kwargs.get("router_endpoint")

    serialization = resolve.env(SERIALIZATION_ENV_VAR, empty_is_unset=True)
    if serialization is not None:
        try:
            kwargs["allowed_serialization"] = allowed_serialization(
                {SERIALIZATION_ENV_VAR: serialization}
            )
        except ValueError as exc:
            resolve.fail(str(exc))

    if "auth_token_file" not in kwargs:
        token = resolve.env("KCORAL_AUTH_TOKEN", empty_is_unset=True)
        if token is not None:
            try:
                parse_tokens(token)  # as a token file's text: checked before anything starts
            except ValueError as exc:
                resolve.fail(f"KCORAL_AUTH_TOKEN: {exc}")
            kwargs["auth_token"] = token

    try:
        config = ServerConfig(**kwargs)
        if config.auth_token_file is not None:
            # Read now: a missing token file must stop the server before anything starts.
            config = replace(config, auth_token=config.read_auth_token())
        settings = ServerSettings(config=config, **listen)
    except InvalidConfigError as exc:
        resolve.refuse(exc)
    except ValueError as exc:
        resolve.fail(str(exc))

    if config.sandbox != "none":
        _check_readonly_paths(config.sandbox_readonly_paths, resolve)
    if settings.ready_file is not None and (problem := ready_file_problem(settings.ready_file)):
        resolve.fail(f"--ready-file {problem}")
    supervisor = _supervisor_options(args, resolve, router)
    node_child = bool(args.node_child)
    if node_child:
        if router is None:
            resolve.fail("--node-child requires --router")
        supervisor = None
    if router is not None and not sys.platform.startswith("linux"):
        resolve.fail("--router (routed deployments) needs Linux")
    return replace(
        settings, supervisor=supervisor, node_child=node_child, gpus_given="gpus" in kwargs
    )


def _check_readonly_paths(paths: Sequence[Path], resolve: _Resolver) -> None:
    """Each ``--sandbox-readonly-path`` exists and may be shown (not ``/dev/shm``, not the
    workspace root's folder): checked before anything starts, where a missing one was left
    out of every sandbox without a word and a refused one failed after ``server_started``."""
    for path in paths:
        if not path.exists():
            resolve.fail(f"--sandbox-readonly-path {path} does not exist")
    try:
        check_readonly_paths(paths)
    except SandboxError as exc:
        resolve.fail(str(exc))


def _supervisor_options(
    args: argparse.Namespace, resolve: _Resolver, router: str | None
) -> SupervisorOptions | None:
    given = resolve.settings(SupervisorOptions, args)
    if router is None:
        if given:
            option = next(o for o in declared_settings(SupervisorOptions) if o.name in given)
            resolve.fail(f"{option.metadata['flag']} requires --router")
        return None
    try:
        return SupervisorOptions(**given)
    except InvalidConfigError as exc:
        resolve.refuse(exc)
