"""Server configuration: the frozen, validated ``ServerConfig``.

Standard library only: ``kcoral.ServerConfig`` resolves to this module and must import
without the server extra (CLIENT_API.md §1.1). Fields, defaults and rules follow SERVER.md §2,
EXTENSIONS.md §2/§6 and ROUTER.md §3. The ``kcoral server`` command line that fills it lives
in ``kcoral_server.cli_args``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kcoral_server.browser_guard import host_problem, origin_problem
from kcoral_server.identity import parse_tokens

# Standard library only like this module; every entry point has loaded kcoral already.
from kcoral.protocol.headers import SERIALIZATION_FORMATS

GIB = 1024**3
DEVICE_MODES = ("auto", "gpu", "cpu")
# Test-only runtime: GPU-mode pool and leases over fake devices, no CUDA (not in --help).
FAKE_GPU_DEVICE = "fake-gpu"
SANDBOXES = ("auto", "bubblewrap", "none")
REDACTED = "<redacted>"

_NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", re.ASCII)


class InvalidConfigError(ValueError):
    """An invalid setting. ``field`` names the ``ServerConfig`` field (or CLI-only option)."""

    def __init__(self, field_name: str, rule: str, cli_message: str | None = None) -> None:
        super().__init__(f"{field_name} {rule}")
        self.field = field_name
        self.rule = rule
        # Cross-field rules read differently on the command line than in Python.
        self.cli_message = cli_message or f"{option_name(field_name)} {rule}"


def option_name(field_name: str) -> str:
    """The ``kcoral server`` option that sets ``field_name`` (its declared flag, if any)."""
    for declared in flag_settings():
        if declared.name == field_name:
            return declared.metadata["flag"]
    special = {
        "sandbox_readonly_paths": "--sandbox-readonly-path",
        "auth_token": "KCORAL_AUTH_TOKEN",
        "allowed_serialization": "KCORAL_ALLOWED_SERIALIZATION",
        "allowed_origins": "--allowed-origin",
        "allowed_hosts": "--allowed-host",
    }
    return special.get(field_name, "--" + field_name.replace("_", "-"))


@lru_cache(maxsize=1)
def physical_memory_bytes() -> int | None:
    """Total physical memory, or ``None`` when the platform does not say."""
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        page_size = os.sysconf("SC_PAGE_SIZE")
        if pages > 0 and page_size > 0:
            return pages * page_size
    except (AttributeError, ValueError, OSError):
        pass
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def default_cache_capacity_bytes() -> int:
    """EXTENSIONS.md §2: the smaller of 16 GiB and a quarter of physical memory."""
    memory = physical_memory_bytes()
    return 16 * GIB if memory is None else min(16 * GIB, memory // 4)


def default_disk_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """SERVER.md §2: ``$XDG_CACHE_HOME/kcoral/files`` if absolute, else ``~/.cache/...``."""
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "kcoral" / "files"
    home = env.get("HOME") or str(Path.home())
    return Path(home) / ".cache" / "kcoral" / "files"


def setting(
    default: Any = MISSING,
    *,
    flag: str,
    kind: str,
    help: str = "",
    shown_default: str | None = None,
    env: str | None = None,
    hidden: bool = False,
    default_factory: Any = MISSING,
    empty: str | None = None,
    env_empty_is_unset: bool = False,
    cli_default: Any = MISSING,
    env_in_help: bool = True,
    metavar: str | None = None,
    secret: bool = False,
) -> Any:
    """A ``ServerConfig`` field that ``kcoral server`` sets from one flag (and ``env`` when
    the flag is absent): declared once, here; ``cli_args`` derives the argparse option, its
    help (``help`` plus "(default …)": ``shown_default`` or the default itself) and the
    copy into the config from it. ``hidden`` keeps it out of ``--help``.

    ``kind`` says how the text parses: ``int``, ``seconds``, ``text``, ``path``, or
    ``switch`` (a flag without a value that sets ``True``; ``False`` for a ``--no-`` flag).
    ``empty`` is what the value ``''`` means: ``"disables"`` (the setting becomes ``None``)
    or ``"refused"`` (a usage error); ``env_empty_is_unset`` makes an empty environment
    variable count as absent. ``cli_default`` is the command line's default where it differs
    from the field's: a value, or a function of the environment. A ``secret`` stays out of
    ``repr``."""
    metadata = {
        "flag": flag,
        "kind": kind,
        "help": help,
        "shown_default": shown_default,
        "env": env,
        "hidden": hidden,
        "empty": empty,
        "env_empty_is_unset": env_empty_is_unset,
        "cli_default": cli_default,
        "env_in_help": env_in_help,
        "metavar": metavar,
    }
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata, repr=not secret)
    return field(default=default, metadata=metadata, repr=not secret)


def flag_settings() -> list[Field]:
    """The ``ServerConfig`` fields declared with ``setting``, in declaration order."""
    return [f for f in fields(ServerConfig) if "flag" in f.metadata]


@dataclass(frozen=True)
class ServerConfig:
    """Frozen server configuration (SERVER.md §2 plus EXTENSIONS.md); validated on creation.

    ``max_inflight_request_bytes=None`` resolves to ``2 * max_request_bytes`` (0 = no limit).
    ``auth_token`` holds the token itself (from ``KCORAL_AUTH_TOKEN`` or read from
    ``auth_token_file`` by the CLI); it never appears in ``repr`` or logs.
    """

    device: str = setting(
        "auto",
        flag="--device",
        kind="text",
        help="device mode",
        env="KCORAL_SERVER_DEVICE",
        metavar="{auto,gpu,cpu}",
    )
    gpus: list[int] = field(default_factory=lambda: [0])
    num_workers: int = setting(1, flag="--num-workers", kind="int", help="CPU mode worker count")
    workers_per_gpu: int = setting(
        8, flag="--workers-per-gpu", kind="int", help="GPU mode workers per GPU"
    )
    max_requests_per_worker: int = setting(
        1,
        flag="--max-requests-per-worker",
        kind="int",
        help="requests before a worker is replaced; 0 = reuse without limit",
    )
    worker_termination_grace_seconds: float = setting(
        5.0, flag="--worker-termination-grace-seconds", kind="seconds", help="SIGTERM->SIGKILL"
    )
    worker_wait_timeout_seconds: float = setting(
        1800.0, flag="--worker-wait-timeout-seconds", kind="seconds", help="wait for a worker"
    )
    # A request body that receives no bytes for this long is dropped (slowloris defence);
    # the limit is on idleness, not on the whole upload, so big slow uploads still work.
    body_timeout_seconds: float = setting(
        60.0,
        flag="--body-timeout-seconds",
        kind="seconds",
        help="drop a request whose body sends nothing for this long, or averages under "
        "1024 bytes/s after it",
    )
    default_timeout_seconds: float = setting(
        300.0, flag="--default-timeout-seconds", kind="seconds"
    )
    max_timeout_seconds: float = setting(
        900.0, flag="--max-timeout-seconds", kind="seconds", help="clamp"
    )
    max_request_bytes: int = setting(
        268435456, flag="--max-request-bytes", kind="int", help="413 above"
    )
    max_response_bytes: int = setting(
        268435456, flag="--max-response-bytes", kind="int", help="500 above"
    )
    output_limit_bytes: int = setting(
        1048576, flag="--output-limit-bytes", kind="int", help="per-stream capture"
    )
    max_output_limit_bytes: int = setting(
        16777216, flag="--max-output-limit-bytes", kind="int", help="clamp"
    )
    cache_capacity_bytes: int = setting(
        default_factory=default_cache_capacity_bytes,
        flag="--cache-capacity-bytes",
        kind="int",
        help="memory cache",
        shown_default=": the smaller of 16 GiB and 1/4 of physical memory",
    )
    disk_cache_dir: Path | None = setting(  # noqa: RUF009 (setting is a field)
        default_factory=default_disk_cache_dir,
        flag="--disk-cache-dir",
        kind="path",
        help="file-blob cache",
        empty="disables",
        shown_default="~/.cache/kcoral/files",
        cli_default=default_disk_cache_dir,  # of the environment the command line was given
    )
    disk_cache_capacity_mbytes: int = setting(
        16384, flag="--disk-cache-capacity-mbytes", kind="int", help="MiB; 0 disables"
    )
    log_dir: Path | None = setting(  # noqa: RUF009 (setting is a field)
        None,
        flag="--log-dir",
        kind="path",
        help="event log directory",
        empty="disables",
        env="KCORAL_LOG_DIR",
        cli_default="logs",
    )
    log_console: bool = setting(
        True, flag="--no-log-console", kind="switch", help="no stderr mirror"
    )
    log_programs: bool = setting(
        True, flag="--no-log-programs", kind="switch", help="do not store programs"
    )
    sandbox: str = setting(
        "auto",
        flag="--sandbox",
        kind="text",
        help="auto: bubblewrap where it works, else none with a warning",
        metavar="{auto,bubblewrap,none}",
    )
    sandbox_readonly_paths: list[Path] = field(default_factory=list)
    router_endpoint: str | None = setting(
        None,
        flag="--router",
        kind="text",
        help="router origin",
        env="KCORAL_ROUTER_ENDPOINT",
        env_empty_is_unset=True,
    )
    node_id: str | None = setting(
        None,
        flag="--node-id",
        kind="text",
        help="node name",
        env="KCORAL_NODE_ID",
        env_empty_is_unset=True,
    )
    node_token: str | None = setting(
        None,
        flag="--node-token",
        kind="text",
        help="node token; prefer env KCORAL_NODE_TOKEN",
        env="KCORAL_NODE_TOKEN",
        env_empty_is_unset=True,
        env_in_help=False,
        empty="refused",
        secret=True,
    )
    # EXTENSIONS.md additions
    job_retention_seconds: float = setting(
        3600.0, flag="--job-retention-seconds", kind="seconds", help="keep finished jobs"
    )
    max_sessions: int = setting(
        1, flag="--max-sessions", kind="int", help="session seats beyond the stateless ones"
    )
    session_idle_seconds: float = setting(
        600.0, flag="--session-idle-seconds", kind="seconds", help="end an idle session"
    )
    job_retention_bytes: int = setting(
        GIB,
        flag="--job-retention-bytes",
        kind="int",
        help="results and events of finished jobs kept, in memory and on disk",
    )
    # KCORAL_AUTH_TOKEN is not this setting's variable: it gives auth_token itself.
    auth_token_file: Path | None = setting(  # noqa: RUF009 (setting is a field)
        None,
        flag="--auth-token-file",
        kind="path",
        help="require this bearer token (or env KCORAL_AUTH_TOKEN)",
        empty="refused",
    )
    auth_token: str | None = field(default=None, repr=False)
    allow_unauthenticated: bool = setting(
        False,
        flag="--allow-unauthenticated",
        kind="switch",
        help="allow no token on a non-loopback address",
    )
    max_inflight_request_bytes: int | None = setting(
        None,
        flag="--max-inflight-request-bytes",
        kind="int",
        help="request body bytes received and held before 503 (declared lengths reserve "
        "nothing); 0 = no limit",
        shown_default="2 x --max-request-bytes",
    )
    # None: the default share of physical memory, enforced only where a cgroup can (limits.py)
    worker_memory_limit_bytes: int | None = setting(
        None,
        flag="--worker-memory-limit-bytes",
        kind="int",
        help="per worker; 0 = none",
        shown_default=": physical memory / workers, at least 4 GiB, where a cgroup enforces it",
    )
    # None: KCORAL_WORKER_PROCESS_LIMIT, else limits.DEFAULT_PROCESS_LIMIT; 0 = none
    worker_process_limit: int | None = setting(
        None,
        flag="--worker-process-limit",
        kind="int",
        help="processes and threads per worker (cgroup pids.max); 0 = none",
        shown_default="4096",
        env="KCORAL_WORKER_PROCESS_LIMIT",
    )
    # Variables no worker inherits (exact names, or prefixes ending in '*'), besides the
    # KCoral secrets that no worker ever gets (sandbox.is_secret_variable).
    worker_env_deny: list[str] = field(default_factory=list)
    allowed_serialization: list[str] = field(default_factory=lambda: list(SERIALIZATION_FORMATS))
    fake_gpu_count: int = setting(0, flag="--fake-gpu-count", kind="int", hidden=True)
    # Browsers (EXTENSIONS §6): extra Origin / Host values a request may carry.
    allowed_origins: list[str] = field(default_factory=list)
    allowed_hosts: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        _normalize(self)
        validate(self)

    def validate(self) -> None:
        """Raise ``InvalidConfigError`` (a ``ValueError``) if any rule is broken."""
        validate(self)

    def read_auth_token(self) -> str | None:
        """The client auth token: ``auth_token``, else the stripped contents of the file.

        Raises ``InvalidConfigError`` for an unreadable or empty token file.
        """
        if self.auth_token is not None:
            return self.auth_token
        if self.auth_token_file is None:
            return None
        try:
            token = self.auth_token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or exc.__class__.__name__
            raise InvalidConfigError("auth_token_file", f"cannot be read: {reason}") from None
        if not token:
            raise InvalidConfigError("auth_token_file", "is empty")
        try:
            parse_tokens(token)  # one bare token, or `NAME TOKEN [admin]` lines
        except ValueError as exc:
            raise InvalidConfigError("auth_token_file", str(exc)) from None
        return token


def _set(config: ServerConfig, name: str, value: Any) -> None:
    object.__setattr__(config, name, value)


def _normalize(config: ServerConfig) -> None:
    """Accept friendly Python inputs (str paths, tuples) and resolve derived defaults."""
    for name in ("disk_cache_dir", "log_dir", "auth_token_file"):
        value = getattr(config, name)
        if isinstance(value, str):
            _set(config, name, Path(value) if value else None)
    if isinstance(config.gpus, tuple):
        _set(config, "gpus", list(config.gpus))
    if isinstance(config.sandbox_readonly_paths, (tuple, list)):
        paths = [Path(p) if isinstance(p, str) else p for p in config.sandbox_readonly_paths]
        _set(config, "sandbox_readonly_paths", paths)
    for name in ("allowed_serialization", "allowed_origins", "allowed_hosts", "worker_env_deny"):
        if isinstance(getattr(config, name), tuple):
            _set(config, name, list(getattr(config, name)))
    for name in (
        "worker_termination_grace_seconds",
        "worker_wait_timeout_seconds",
        "body_timeout_seconds",
        "default_timeout_seconds",
        "max_timeout_seconds",
        "job_retention_seconds",
        "session_idle_seconds",
    ):
        value = getattr(config, name)
        if isinstance(value, int) and not isinstance(value, bool):
            _set(config, name, float(value))
    if config.max_inflight_request_bytes is None and _is_int(config.max_request_bytes):
        _set(config, "max_inflight_request_bytes", 2 * config.max_request_bytes)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(config: ServerConfig, name: str, minimum: int) -> None:
    value = getattr(config, name)
    if not _is_int(value):
        raise InvalidConfigError(name, f"must be an integer (got {value!r})")
    if value < minimum:
        raise InvalidConfigError(name, f"must be >= {minimum} (got {value})")


def _check_seconds(config: ServerConfig, name: str, *, positive: bool) -> None:
    value = getattr(config, name)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise InvalidConfigError(name, f"must be a finite number of seconds (got {value!r})")
    if positive and value <= 0:
        raise InvalidConfigError(name, f"must be > 0 (got {value})")
    if not positive and value < 0:
        raise InvalidConfigError(name, f"must be >= 0 (got {value})")


def _check_optional_path(config: ServerConfig, name: str) -> None:
    value = getattr(config, name)
    if value is not None and not isinstance(value, Path):
        raise InvalidConfigError(name, f"must be a path or None (got {value!r})")


def _check_bool(config: ServerConfig, name: str) -> None:
    if not isinstance(getattr(config, name), bool):
        raise InvalidConfigError(name, f"must be a bool (got {getattr(config, name)!r})")


def validate(config: ServerConfig) -> None:
    """Every rule of SERVER.md §2 / EXTENSIONS.md / ROUTER.md §3 that needs no I/O."""
    devices = (*DEVICE_MODES, FAKE_GPU_DEVICE)
    if config.device not in devices:
        raise InvalidConfigError(
            "device", f"must be one of {', '.join(DEVICE_MODES)} (got {config.device!r})"
        )
    _check_int(config, "fake_gpu_count", 0)
    if config.device == FAKE_GPU_DEVICE and config.fake_gpu_count < 1:
        raise InvalidConfigError(
            "fake_gpu_count",
            f"must be >= 1 with device {FAKE_GPU_DEVICE!r}",
        )
    if not isinstance(config.gpus, list):
        raise InvalidConfigError("gpus", f"must be a list of GPU ids (got {config.gpus!r})")
    if config.device != "cpu":  # SERVER.md §2: ignored in CPU mode
        for gpu in config.gpus:
            if not _is_int(gpu) or gpu < 0:
                raise InvalidConfigError("gpus", f"must hold GPU ids >= 0 (got {gpu!r})")
        if not config.gpus and config.device in ("gpu", FAKE_GPU_DEVICE):
            raise InvalidConfigError("gpus", "must not be empty in GPU mode")

    _check_int(config, "num_workers", 1)
    _check_int(config, "workers_per_gpu", 1)
    _check_int(config, "max_requests_per_worker", 0)
    _check_seconds(config, "worker_termination_grace_seconds", positive=False)
    _check_seconds(config, "worker_wait_timeout_seconds", positive=False)
    _check_seconds(config, "body_timeout_seconds", positive=True)
    _check_seconds(config, "default_timeout_seconds", positive=True)
    _check_seconds(config, "max_timeout_seconds", positive=True)
    _check_int(config, "max_request_bytes", 1)
    _check_int(config, "max_response_bytes", 1)
    _check_int(config, "output_limit_bytes", 0)
    _check_int(config, "max_output_limit_bytes", 0)
    _check_int(config, "cache_capacity_bytes", 0)
    _check_int(config, "disk_cache_capacity_mbytes", 0)
    _check_seconds(config, "job_retention_seconds", positive=False)
    _check_int(config, "job_retention_bytes", 0)
    _check_int(config, "max_sessions", 0)
    _check_seconds(config, "session_idle_seconds", positive=True)
    _check_int(config, "max_inflight_request_bytes", 0)
    for name in ("worker_memory_limit_bytes", "worker_process_limit"):
        if getattr(config, name) is not None:
            _check_int(config, name, 0)
    if not isinstance(config.worker_env_deny, list) or not all(
        isinstance(name, str) and name and "=" not in name for name in config.worker_env_deny
    ):
        raise InvalidConfigError("worker_env_deny", "must be a list of variable names")

    for name in ("disk_cache_dir", "log_dir", "auth_token_file"):
        _check_optional_path(config, name)
    for name in ("log_console", "log_programs", "allow_unauthenticated"):
        _check_bool(config, name)

    if config.sandbox not in SANDBOXES:
        raise InvalidConfigError(
            "sandbox", f"must be one of {', '.join(SANDBOXES)} (got {config.sandbox!r})"
        )
    if not isinstance(config.sandbox_readonly_paths, list):
        raise InvalidConfigError("sandbox_readonly_paths", "must be a list of paths")
    for path in config.sandbox_readonly_paths:
        if not isinstance(path, Path):
            raise InvalidConfigError("sandbox_readonly_paths", f"must hold paths (got {path!r})")
        # SERVER.md §14: '/' would shadow the whole sandbox (ancestors of the workspace
        # root are checked when the sandbox starts).
        if Path(os.path.abspath(path)) == Path("/"):
            raise InvalidConfigError("sandbox_readonly_paths", "must not be '/'")
    if config.sandbox_readonly_paths and config.sandbox == "none":
        raise InvalidConfigError(
            "sandbox_readonly_paths",
            "requires sandbox 'auto' or 'bubblewrap'",
            "--sandbox-readonly-path requires --sandbox auto or bubblewrap",
        )

    _validate_router(config)

    if config.auth_token is not None and (
        not isinstance(config.auth_token, str) or not config.auth_token
    ):
        raise InvalidConfigError("auth_token", "must be a non-empty string")
    if not isinstance(config.allowed_serialization, list):
        raise InvalidConfigError("allowed_serialization", "must be a list of format names")
    for name in config.allowed_serialization:
        if name not in SERIALIZATION_FORMATS:
            raise InvalidConfigError(
                "allowed_serialization",
                f"names an unknown format {name!r} (known: {', '.join(SERIALIZATION_FORMATS)})",
            )
    for name, problem_of in (("allowed_origins", origin_problem), ("allowed_hosts", host_problem)):
        values = getattr(config, name)
        if not isinstance(values, list):
            raise InvalidConfigError(name, "must be a list of strings")
        for value in values:
            problem = problem_of(value)
            if problem:
                raise InvalidConfigError(name, problem)


def _validate_router(config: ServerConfig) -> None:
    if config.router_endpoint is not None:
        problem = router_origin_problem(config.router_endpoint)
        if problem:
            raise InvalidConfigError("router_endpoint", problem)
    if config.node_id is not None and not valid_node_id(config.node_id):
        raise InvalidConfigError(
            "node_id",
            "must be 1-64 characters: an ASCII letter or digit, then [A-Za-z0-9_.-]",
        )
    if config.router_endpoint is not None and config.node_id is None:
        raise InvalidConfigError(
            "router_endpoint", "requires node_id", "--router requires --node-id"
        )
    if config.node_id is not None and config.router_endpoint is None:
        raise InvalidConfigError(
            "node_id", "requires router_endpoint", "--node-id requires --router"
        )
    if config.node_token is not None and (
        not isinstance(config.node_token, str) or not config.node_token
    ):
        raise InvalidConfigError("node_token", "must be a non-empty string")


def valid_node_id(value: object) -> bool:
    """ROUTER.md §3: 1–64 characters, first ASCII alphanumeric, others ``[A-Za-z0-9_.-]``."""
    return isinstance(value, str) and _NODE_ID.fullmatch(value) is not None


def router_origin_problem(value: object) -> str | None:
    """Why ``value`` is not a bare ``http(s)://host[:port]`` origin (ROUTER.md §3), or None."""
    if not isinstance(value, str) or not value:
        return "must be an http:// or https:// origin"
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        return f"is not a valid origin ({exc})"
    if parts.scheme not in ("http", "https") or not value.startswith(parts.scheme + "://"):
        return "must start with http:// or https://"
    if not parts.hostname:
        return "must name a host"
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return "must not contain user info"
    if parts.path not in ("", "/"):
        return "must not contain a path"
    if parts.query or parts.fragment or "?" in value or "#" in value:
        return "must not contain a query or fragment"
    if port == 0:
        return "must have a port in 1-65535"
    return None


def config_for_log(config: ServerConfig) -> dict[str, Any]:
    """The ``server_started`` event's ``config``: JSON values, node token redacted.

    The auth token is left out entirely (EXTENSIONS.md §6).
    """
    result: dict[str, Any] = {}
    for item in fields(config):
        if item.name == "auth_token":
            continue
        value = getattr(config, item.name)
        if item.name == "node_token" and value is not None:
            value = REDACTED
        elif isinstance(value, Path):
            value = str(value)
        elif isinstance(value, list):
            value = [str(v) if isinstance(v, Path) else v for v in value]
        result[item.name] = value
    return result


# Names that moved to ``kcoral_server.cli_args``; resolved lazily so that this module keeps
# importing only the standard library and old imports keep working.
_MOVED_TO_CLI_ARGS = frozenset(
    {
        "SupervisorOptions",
        "ServerSettings",
        "build_server_parser",
        "parse_server_args",
        "parse_integer",
        "parse_seconds",
        "parse_gpus",
    }
)


def __getattr__(name: str) -> Any:
    if name in _MOVED_TO_CLI_ARGS:
        from kcoral_server import cli_args

        return getattr(cli_args, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
