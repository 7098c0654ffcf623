"""Server configuration: the frozen, validated ``ServerConfig``.

Standard library only: ``kcoral.ServerConfig`` resolves to this module and must import
without the server extra (CLIENT_API.md §1.1). Fields, defaults and rules follow SERVER.md §2,
EXTENSIONS.md §2/§6 and ROUTER.md §3. The ``kcoral server`` command line that fills it lives
in ``kcoral_server.settings.command_line``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

# Standard library only like this module; every entry point has loaded kcoral already.
from kcoral.protocol.headers import PRINTABLE_TOKEN, SERIALIZATION_FORMATS
from kcoral.protocol.selector import BUILT_IN_KEYS
from kcoral_server.front_door.browser_guard import host_problem, origin_problem
from kcoral_server.front_door.callers import parse_tokens
from kcoral_server.front_door.token_file import TokenFileError, read_client_tokens, refusal
from kcoral_server.router.identity import node_token_problem

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
    # The two settings that only a variable sets (cli_args says why).
    special = {
        "auth_token": "KCORAL_AUTH_TOKEN",
        "allowed_serialization": "KCORAL_ALLOWED_SERIALIZATION",
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


#: the most worker processes ``--num-workers`` and ``--workers-per-gpu`` may ask for: each
#: is a process with its seat (and a spare); 99,999,999 ran a machine out of memory after
#: the server said it started (flags soak)
MAX_WORKERS = 1024

#: ``--help``'s option groups (``setting(group=...)``), in the order ``--help`` shows them.
SETTING_GROUPS: dict[str, str] = {
    "network": "network and auth",
    "workers": "workers",
    "requests": "requests: time and size limits",
    "sessions": "sessions and jobs",
    "sandbox": "sandbox and worker limits",
    "caches": "caches",
    "logging": "logging",
    "router": "router and node",
    "nodes": "nodes",  # the router's view of its nodes (kcoral router)
}


def bearer_token_problem(value: object) -> str | None:
    """Why ``value`` cannot be a token a scraper sends as ``Bearer``, or None: the metrics
    token's rule on a server and a router alike (EXTENSIONS §13)."""
    if isinstance(value, str) and PRINTABLE_TOKEN.fullmatch(value):
        return None
    return "must be printable ASCII without spaces, as a bearer token"


def variable_name_problem(name: object) -> str | None:
    """Why ``name`` cannot be an environment variable name of ``--worker-env-deny`` or
    ``--worker-env-allow`` (``NAME``, or ``NAME*`` for a prefix), or None."""
    if isinstance(name, str) and name and "=" not in name:
        return None
    return "must be a list of variable names"


def setting(
    default: Any = MISSING,
    *,
    flag: str,
    kind: str,
    group: str | None = None,
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
    repeatable: bool = False,
    minimum: float | None = None,
    positive: bool = False,
    problem: Callable[[Any], str | None] | None = None,
) -> Any:
    """A field that ``kcoral server`` sets from one flag (and ``env`` when the flag is
    absent): declared once, here; ``cli_args`` derives the argparse option, its help
    (``help`` plus "(default …)": ``shown_default`` or the default itself), the copy into
    the config and ``validate`` derives the field's own rule from it. ``hidden`` keeps it
    out of ``--help``.

    ``group`` (required; a key of ``SETTING_GROUPS``) is the part of ``--help`` that lists
    it, so that every new flag lands somewhere a reader looks.

    ``kind`` says how the text parses: ``int``, ``bytes`` (an ``int`` field whose text may
    end in ``K``, ``M``, ``G`` or ``T``: KiB, MiB, GiB, TiB; ``--help`` shows it in those units),
    ``seconds``, ``number``, ``text``, ``path``,
    ``gpu_ids`` (comma-separated GPU ids; a bad list is ignored in CPU mode, SERVER.md §2),
    or ``switch`` (a flag without a value that sets ``True``; ``False`` for a ``--no-``
    flag). A ``repeatable`` flag may be given many times and the field is the list of its
    values (``text`` or ``path``). ``empty`` is what the value ``''`` means: ``"disables"``
    (the setting becomes ``None``) or ``"refused"`` (a usage error); ``env_empty_is_unset``
    makes an empty environment variable count as absent. ``cli_default`` is the command
    line's default where it differs from the field's: a value, or a function of the
    environment. ``minimum`` bounds an ``int`` (``None`` is allowed where the default is
    ``None``); ``positive`` makes a ``seconds`` value > 0 instead of >= 0. ``problem`` says
    why a value (each value of a ``repeatable``; never ``None``) is refused, or None. A
    ``secret`` stays out of ``repr``."""
    if group not in SETTING_GROUPS:
        # Raised at import: a declaration merged without a group fails loudly, naming it.
        raise TypeError(
            f"setting {flag}: group= is required, one of {', '.join(SETTING_GROUPS)} "
            f"(got {group!r})"
        )
    metadata = {
        "flag": flag,
        "kind": kind,
        "group": group,
        "help": help,
        "shown_default": shown_default,
        "env": env,
        "hidden": hidden,
        "empty": empty,
        "env_empty_is_unset": env_empty_is_unset,
        "cli_default": cli_default,
        "env_in_help": env_in_help,
        "metavar": metavar,
        "repeatable": repeatable,
        "minimum": minimum,
        "positive": positive,
        "problem": problem,
    }
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata, repr=not secret)
    return field(default=default, metadata=metadata, repr=not secret)


def declared_settings(owner: Any) -> list[Field]:
    """The fields of dataclass ``owner`` declared with ``setting``, in declaration order."""
    return [f for f in fields(owner) if "flag" in f.metadata]


def flag_settings() -> list[Field]:
    """The ``ServerConfig`` fields declared with ``setting``, in declaration order."""
    return declared_settings(ServerConfig)


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
        group="workers",
        help="where programs run: gpu, cpu, or auto (gpu when CUDA answers, else cpu)",
        env="KCORAL_SERVER_DEVICE",
        metavar="{auto,gpu,cpu}",
        problem=lambda value: _one_of(value, DEVICE_MODES, hidden=(FAKE_GPU_DEVICE,)),
    )
    gpus: list[int] = setting(  # noqa: RUF009 (setting is a field)
        default_factory=lambda: [0],
        flag="--gpus",
        kind="gpu_ids",
        group="workers",
        help="comma-separated physical GPU ids the workers use (ignored in CPU mode)",
        shown_default="0",
        env="KCORAL_SERVER_GPUS",
    )
    num_workers: int = setting(
        1,
        flag="--num-workers",
        kind="int",
        group="workers",
        help="worker processes in CPU mode: programs that run at once",
        minimum=1,
        problem=lambda count: _at_most(count, MAX_WORKERS),
    )
    workers_per_gpu: int = setting(
        8,
        flag="--workers-per-gpu",
        kind="int",
        group="workers",
        help="worker processes per GPU in GPU mode (they take turns on the GPU)",
        minimum=1,
        problem=lambda count: _at_most(count, MAX_WORKERS),
    )
    max_requests_per_worker: int = setting(
        1,
        flag="--max-requests-per-worker",
        kind="int",
        group="workers",
        help="programs a worker runs before a fresh one replaces it; 0 = reuse without limit",
        minimum=0,
    )
    # SERVER §6 (added 2026-12, issue 31): the seat's next fresh worker is started while
    # its current one runs, so back-to-back programs do not wait for a fork
    spare_workers: bool = setting(
        True,
        flag="--no-spare-workers",
        kind="switch",
        group="workers",
        help="do not start each seat's next fresh worker ahead when every worker serves one "
        "program (spares count in the default memory share)",
    )
    worker_termination_grace_seconds: float = setting(
        5.0,
        flag="--worker-termination-grace-seconds",
        kind="seconds",
        group="workers",
        help="how long a worker being stopped has after SIGTERM before SIGKILL",
    )
    worker_wait_timeout_seconds: float = setting(
        1800.0,
        flag="--worker-wait-timeout-seconds",
        kind="seconds",
        group="workers",
        help="how long a request waits for a free worker before 503 busy",
    )
    # A request body that receives no bytes for this long is dropped (slowloris defence);
    # the limit is on idleness, not on the whole upload, so big slow uploads still work.
    body_timeout_seconds: float = setting(
        60.0,
        flag="--body-timeout-seconds",
        kind="seconds",
        group="requests",
        help="drop a request whose body sends nothing for this long, or averages under "
        "1024 bytes/s after it",
        positive=True,
    )
    # Issue 28: a connection that sends nothing, or dribbles its head, held a socket for as
    # long as Tornado waits for a head. Tornado counts that wait from the connection's start
    # or its previous answer, so this is also the keep-alive idle time; kcoral clients drop
    # a pooled connection after half the default (kcoral.connection.keep_alive), before it closes
    # here.
    request_head_timeout_seconds: float = setting(
        10.0,
        flag="--request-head-timeout-seconds",
        kind="seconds",
        group="network",
        help="close a connection that has not sent a complete request head within this "
        "long of opening, or of its previous answer",
        positive=True,
    )
    default_timeout_seconds: float = setting(
        300.0,
        flag="--default-timeout-seconds",
        kind="seconds",
        group="requests",
        help="run time of a program that asks for no timeout",
        positive=True,
    )
    max_timeout_seconds: float = setting(
        900.0,
        flag="--max-timeout-seconds",
        kind="seconds",
        group="requests",
        help="longest run time a program may ask for (a longer one gets this)",
        positive=True,
    )
    max_request_bytes: int = setting(
        268435456,
        flag="--max-request-bytes",
        kind="bytes",
        group="requests",
        help="largest request body; a larger one is refused with 413",
        minimum=1,
    )
    max_response_bytes: int = setting(
        268435456,
        flag="--max-response-bytes",
        kind="bytes",
        group="requests",
        help="largest answer; a program whose results are larger fails (response_too_large)",
        minimum=1,
    )
    output_limit_bytes: int = setting(
        1048576,
        flag="--output-limit-bytes",
        kind="bytes",
        group="requests",
        help="stdout and stderr kept per stream when a program asks for no limit",
        minimum=0,
    )
    max_output_limit_bytes: int = setting(
        16777216,
        flag="--max-output-limit-bytes",
        kind="bytes",
        group="requests",
        help="most stdout or stderr a program may ask to keep (a larger ask gets this)",
        minimum=0,
    )
    cache_capacity_bytes: int = setting(
        default_factory=default_cache_capacity_bytes,
        flag="--cache-capacity-bytes",
        kind="bytes",
        group="caches",
        help="memory for uploaded blobs kept for later requests",
        shown_default=": the smaller of 16 GiB and 1/4 of physical memory",
        minimum=0,
    )
    disk_cache_dir: Path | None = setting(  # noqa: RUF009 (setting is a field)
        default_factory=default_disk_cache_dir,
        flag="--disk-cache-dir",
        kind="path",
        group="caches",
        help="folder that keeps uploaded file blobs across restarts",
        empty="disables",
        shown_default="~/.cache/kcoral/files",
        cli_default=default_disk_cache_dir,  # of the environment the command line was given
    )
    disk_cache_capacity_mbytes: int = setting(
        16384,
        flag="--disk-cache-capacity-mbytes",
        kind="int",
        group="caches",
        help="size of the disk cache in MiB; 0 disables it",
        shown_default="16384 MiB = 16 GiB",
        minimum=0,
    )
    log_dir: Path | None = setting(  # noqa: RUF009 (setting is a field)
        None,
        flag="--log-dir",
        kind="path",
        group="logging",
        help="folder for the event log (JSON lines) and the programs received",
        empty="disables",
        env="KCORAL_LOG_DIR",
        cli_default="logs",
    )
    log_console: bool = setting(
        True,
        flag="--no-log-console",
        kind="switch",
        group="logging",
        help="do not print the events on stderr, nor access lines but those of 401 and 403",
    )
    log_programs: bool = setting(
        True,
        flag="--no-log-programs",
        kind="switch",
        group="logging",
        help="do not store each program received in the log folder",
    )
    # Any client-token holder decides what is stored there: bounded so it cannot fill the disk.
    log_programs_max_bytes: int = setting(
        GIB,
        flag="--log-programs-max-bytes",
        kind="bytes",
        group="logging",
        help="most bytes of programs a run keeps in the log folder (the oldest are removed "
        "first; a larger program is not stored); 0 = store none",
        minimum=0,
    )
    # Every request adds its lines, so any client-token holder makes it grow: bounded too.
    log_events_max_bytes: int = setting(
        GIB,
        flag="--log-events-max-bytes",
        kind="bytes",
        group="logging",
        help="most bytes of events.jsonl a run keeps: at half of it the file becomes "
        "events.1.jsonl (replacing the one before); 0 = never rotated",
        minimum=0,
    )
    # Each start makes a run folder of up to the two bounds above: restarts without end
    # (a crash loop, a pod's container) would fill the disk a run at a time.
    log_runs_max: int = setting(
        16,
        flag="--log-runs-max",
        kind="int",
        group="logging",
        help="run folders kept in the log folder, this one included: at start the oldest "
        "others no running server holds are removed; 0 = keep every run",
        minimum=0,
    )
    sandbox: str = setting(
        "auto",
        flag="--sandbox",
        kind="text",
        group="sandbox",
        help="run programs inside a bubblewrap sandbox; auto: where bubblewrap works, "
        "else none with a warning",
        metavar="{auto,bubblewrap,none}",
        problem=lambda value: _one_of(value, SANDBOXES),
    )
    sandbox_readonly_paths: list[Path] = setting(  # noqa: RUF009 (setting is a field)
        default_factory=list,
        flag="--sandbox-readonly-path",
        kind="path",
        repeatable=True,
        group="sandbox",
        help="also show programs this host path, read-only, inside the sandbox",
        empty="refused",
        # SERVER.md §14: '/' would shadow the whole sandbox (ancestors of the workspace
        # root are checked when the sandbox starts).
        problem=lambda path: (
            "must not be '/'" if Path(os.path.abspath(path)) == Path("/") else None
        ),
    )
    router_endpoint: str | None = setting(
        None,
        flag="--router",
        kind="text",
        group="router",
        help="run as a node of the router at this origin (http://host:port)",
        env="KCORAL_ROUTER_ENDPOINT",
        env_empty_is_unset=True,
        problem=lambda value: router_origin_problem(value),
    )
    node_id: str | None = setting(
        None,
        flag="--node-id",
        kind="text",
        group="router",
        help="this node's name at the router (with --router)",
        env="KCORAL_NODE_ID",
        env_empty_is_unset=True,
        problem=lambda value: (
            None
            if valid_node_id(value)
            else "must be 1-64 characters: an ASCII letter or digit, then [A-Za-z0-9_.-]"
        ),
    )
    node_token: str | None = setting(
        None,
        flag="--node-token",
        kind="text",
        group="router",
        help="the token this node shows the router; prefer env KCORAL_NODE_TOKEN",
        env="KCORAL_NODE_TOKEN",
        env_empty_is_unset=True,
        env_in_help=False,
        empty="refused",
        secret=True,
        problem=lambda value: (
            node_token_problem(value) if isinstance(value, str) else "must be a string"
        ),
    )
    # ROUTER §6: what the operator says of this node, reported to the router beside its kind.
    node_labels: list[str] = setting(  # noqa: RUF009 (setting is a field)
        default_factory=list,
        flag="--node-label",
        kind="text",
        repeatable=True,
        group="router",
        metavar="KEY=VALUE",
        help="a label of this node at the router (with --router), e.g. pool=big",
        empty="refused",
        problem=lambda value: node_label_problem(value),
    )
    # KCORAL_AUTH_TOKEN is not this setting's variable: it gives auth_token itself.
    auth_token_file: Path | None = setting(  # noqa: RUF009 (setting is a field)
        None,
        flag="--auth-token-file",
        kind="path",
        group="network",
        help="file of the client token(s) every request must carry: one token, or NAME TOKEN "
        "[admin] lines (or env KCORAL_AUTH_TOKEN); SIGHUP reads it again: a removed identity "
        "is refused and its work cancelled",
        empty="refused",
    )
    auth_token: str | None = field(default=None, repr=False)
    metrics_token: str | None = setting(
        None,
        flag="--metrics-token",
        kind="text",
        group="network",
        help="a token that reads /metrics and nothing else (for a scraper that should hold "
        "no client token); prefer env KCORAL_METRICS_TOKEN",
        env="KCORAL_METRICS_TOKEN",
        env_empty_is_unset=True,
        env_in_help=False,
        empty="refused",
        secret=True,
        problem=bearer_token_problem,
    )
    allow_unauthenticated: bool = setting(
        False,
        flag="--allow-unauthenticated",
        kind="switch",
        group="network",
        help="listen on a non-loopback address without a client token (anyone who reaches "
        "the port runs code)",
    )
    # EXTENSIONS.md additions
    job_retention_seconds: float = setting(
        3600.0,
        flag="--job-retention-seconds",
        kind="seconds",
        group="sessions",
        help="how long a finished job's result stays to be fetched",
    )
    job_retention_bytes: int = setting(
        GIB,
        flag="--job-retention-bytes",
        kind="bytes",
        group="sessions",
        help="results and events of finished jobs kept, in memory and on disk",
        minimum=0,
    )
    # None: a quarter of the open-files limit, 16 to 4096 (jobs/job_slots.py says why)
    max_queued_jobs: int | None = setting(
        None,
        flag="--max-queued-jobs",
        kind="int",
        group="sessions",
        help="jobs queued or running at once; past it POST /v1/jobs gets 503 busy. With 2+ "
        "identities one identity may hold half of them, rounded up; 0 = no limit",
        shown_default=": a quarter of the open-files limit, 16 to 4096",
        minimum=0,
    )
    max_sessions: int = setting(
        1,
        flag="--max-sessions",
        kind="int",
        group="sessions",
        help="sessions that may be open at once (each holds a worker of its own); 0 turns "
        "sessions off",
        minimum=0,
    )
    # None: half the seats, rounded up, once there are 2+ seats and 2+ identities (a node
    # behind a router counts as several); session_seats.per_identity_cap says why
    max_sessions_per_identity: int | None = setting(
        None,
        flag="--max-sessions-per-identity",
        kind="int",
        group="sessions",
        help="session seats one identity may hold; 0 = no cap. With one identity (one bare "
        "token, or no token) there is no cap by default",
        shown_default=": half of --max-sessions, rounded up, with 2+ seats and 2+ identities",
        minimum=0,
    )
    session_idle_seconds: float = setting(
        600.0,
        flag="--session-idle-seconds",
        kind="seconds",
        group="sessions",
        help="end a session that runs no program for this long",
        positive=True,
    )
    max_inflight_request_bytes: int | None = setting(
        None,
        flag="--max-inflight-request-bytes",
        kind="bytes",
        group="requests",
        help="request body bytes held at once before new requests get 503 (declared "
        "lengths reserve nothing; with two or more identities one holds at most half); "
        "0 = no limit",
        shown_default="2 x --max-request-bytes",
        minimum=0,
    )
    # None: the default share of physical memory, enforced only where a cgroup can (limits.py)
    worker_memory_limit_bytes: int | None = setting(
        None,
        flag="--worker-memory-limit-bytes",
        kind="bytes",
        group="sandbox",
        help="memory each worker may use; 0 = no limit; all workers together stay under the "
        "workers' memory (physical memory less the cache and a reserve)",
        shown_default=": the workers' memory / seats (session seats included), at least 4 GiB, "
        "where a cgroup enforces it",
        minimum=0,
    )
    # Under bubblewrap (workspace_watch.py): the disk one sandbox directory may hold.
    workspace_limit_bytes: int = setting(
        4 * GIB,
        flag="--workspace-limit-bytes",
        kind="bytes",
        group="sandbox",
        help="disk a sandboxed program's workspace, HOME and caches may hold; past it the "
        "worker is killed and the program fails naming the limit; 0 = none (no bound "
        "without a sandbox)",
        minimum=0,
    )
    # None: KCORAL_WORKER_PROCESS_LIMIT, else limits.DEFAULT_PROCESS_LIMIT; 0 = none
    worker_process_limit: int | None = setting(
        None,
        flag="--worker-process-limit",
        kind="int",
        group="sandbox",
        help="processes and threads per worker (cgroup pids.max); 0 = none",
        shown_default="4096",
        env="KCORAL_WORKER_PROCESS_LIMIT",
        minimum=0,
    )
    # SERVER §1: what the worker fork servers import besides the worker's own modules
    worker_preload: str = setting(
        "torch",
        flag="--worker-preload",
        kind="text",
        group="workers",
        help="modules the worker fork servers import once idle, so fresh workers start with "
        "them; torch (with numpy) where installed, or none",
        env="KCORAL_WORKER_PRELOAD",
        metavar="{torch,none}",
        problem=lambda value: _one_of(value, ("torch", "none")),
    )
    # Variables no worker inherits (exact names, or prefixes ending in '*'), besides the
    # KCoral secrets that no worker ever gets (sandbox.is_secret_variable).
    worker_env_deny: list[str] = setting(  # noqa: RUF009 (setting is a field)
        default_factory=list,
        flag="--worker-env-deny",
        kind="text",
        repeatable=True,
        group="sandbox",
        metavar="NAME",
        help="environment variable no worker inherits; NAME* denies a prefix",
        problem=variable_name_problem,
    )
    # On a server several identities reach, credential-looking variables reach no program
    # (processes/credentials.py) unless named here.
    worker_env_allow: list[str] = setting(  # noqa: RUF009 (setting is a field)
        default_factory=list,
        flag="--worker-env-allow",
        kind="text",
        repeatable=True,
        group="sandbox",
        metavar="NAME",
        help="a credential-looking environment variable (a TOKEN, SECRET, PASSWORD, KEY...) "
        "workers still inherit where several identities reach the server; NAME* a prefix",
        problem=variable_name_problem,
    )
    #: the names withheld from workers at start (``credentials.withheld_credentials``)
    worker_env_withheld: tuple[str, ...] = field(default=(), repr=False)
    # Browsers (EXTENSIONS §6): extra Origin / Host values a request may carry.
    allowed_origins: list[str] = setting(  # noqa: RUF009 (setting is a field)
        default_factory=list,
        flag="--allowed-origin",
        kind="text",
        repeatable=True,
        group="network",
        metavar="ORIGIN",
        help="let web pages from this origin call the server",
        problem=origin_problem,
    )
    allowed_hosts: list[str] = setting(  # noqa: RUF009 (setting is a field)
        default_factory=list,
        flag="--allowed-host",
        kind="text",
        repeatable=True,
        group="network",
        metavar="HOST",
        help="accept this Host name without a client token besides loopback and the listen address",
        problem=host_problem,
    )
    # No flag: EXTENSIONS §4 gives it only a variable, KCORAL_ALLOWED_SERIALIZATION (cli_args).
    allowed_serialization: list[str] = field(default_factory=lambda: list(SERIALIZATION_FORMATS))
    fake_gpu_count: int = setting(
        0, flag="--fake-gpu-count", kind="int", group="workers", hidden=True, minimum=0
    )

    def __post_init__(self) -> None:
        _normalize(self)
        validate(self)

    def validate(self) -> None:
        """Raise ``InvalidConfigError`` (a ``ValueError``) if any rule is broken."""
        validate(self)

    def read_auth_token(self) -> str | None:
        """The client auth token: ``auth_token``, else the stripped contents of the file.

        Raises ``InvalidConfigError`` for a token file that cannot be used (unreadable,
        over 1 MiB, empty, a bad line).
        """
        if self.auth_token is not None:
            return self.auth_token
        if self.auth_token_file is None:
            return None
        try:
            return read_client_tokens(self.auth_token_file).text
        except TokenFileError as exc:
            said = refusal("--auth-token-file", self.auth_token_file, exc)
            raise InvalidConfigError(
                "auth_token_file", said.removeprefix("--auth-token-file "), said
            ) from None


def _set(config: ServerConfig, name: str, value: Any) -> None:
    object.__setattr__(config, name, value)


def _normalize(config: ServerConfig) -> None:
    """Accept friendly Python inputs (str paths, tuples, whole seconds) and resolve derived
    defaults, as each setting's declared kind says."""
    for setting in flag_settings():
        name, kind = setting.name, setting.metadata["kind"]
        value = getattr(config, name)
        if setting.metadata["repeatable"] or kind == "gpu_ids":
            if isinstance(value, tuple):
                value = list(value)
            if kind == "path" and isinstance(value, list):
                value = [Path(p) if isinstance(p, str) else p for p in value]
        elif kind == "path" and isinstance(value, str):
            value = Path(value) if value else None
        elif kind == "seconds" and _is_int(value):
            value = float(value)
        _set(config, name, value)
    if isinstance(config.allowed_serialization, tuple):
        _set(config, "allowed_serialization", list(config.allowed_serialization))
    if config.max_inflight_request_bytes is None and _is_int(config.max_request_bytes):
        _set(config, "max_inflight_request_bytes", 2 * config.max_request_bytes)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _one_of(value: object, shown: tuple[str, ...], hidden: tuple[str, ...] = ()) -> str | None:
    if value in shown or value in hidden:
        return None
    return f"must be one of {', '.join(shown)} (got {value!r})"


def clamped_defaults(config: ServerConfig) -> list[str]:
    """What a program that asks for no limit gets when its default is above the most a
    program may ask for: the max (PROTOCOL's clamp), which the operator is told at start
    (``setting_clamped``) instead of finding out from programs (flags soak)."""
    said = []
    if config.default_timeout_seconds > config.max_timeout_seconds:
        said.append(
            f"--default-timeout-seconds {config.default_timeout_seconds:g} is above "
            f"--max-timeout-seconds {config.max_timeout_seconds:g}: programs that ask for no "
            f"timeout get {config.max_timeout_seconds:g} s"
        )
    if config.output_limit_bytes > config.max_output_limit_bytes:
        said.append(
            f"--output-limit-bytes {config.output_limit_bytes} is above "
            f"--max-output-limit-bytes {config.max_output_limit_bytes}: programs that ask for "
            f"no limit keep {config.max_output_limit_bytes} bytes per stream"
        )
    return said


def _at_most(count: int, largest: int) -> str | None:
    return f"must be at most {largest} (got {count})" if count > largest else None


def _value_problem(setting: Field, value: Any) -> str | None:
    """Why one value of a declared setting breaks its declared kind and rule, or None."""
    meta = setting.metadata
    kind = meta["kind"]
    if kind in ("int", "bytes"):  # a size is an integer field, whatever its flag's text
        if value is None and setting.default is None:
            return None
        if not _is_int(value):
            return f"must be an integer (got {value!r})"
        if meta["minimum"] is not None and value < meta["minimum"]:
            return f"must be >= {meta['minimum']} (got {value})"
    elif kind == "seconds":
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return f"must be a finite number of seconds (got {value!r})"
        if not math.isfinite(value):
            return f"must be a finite number of seconds (got {value!r})"
        if meta["positive"] and value <= 0:
            return f"must be > 0 (got {value})"
        if value < 0:
            return f"must be >= 0 (got {value})"
    elif kind == "switch":
        if not isinstance(value, bool):
            return f"must be a bool (got {value!r})"
    elif kind == "path" and not meta["repeatable"]:
        if value is not None and not isinstance(value, Path):
            return f"must be a path or None (got {value!r})"
    if value is not None and meta["problem"] is not None:
        return meta["problem"](value)
    return None


def _check_declared(config: ServerConfig, setting: Field) -> None:
    """A declared setting's own rule (kind, bounds, ``problem``), for each value of a list."""
    name, meta = setting.name, setting.metadata
    value = getattr(config, name)
    if meta["kind"] == "gpu_ids":
        if not isinstance(value, list):
            raise InvalidConfigError(name, f"must be a list of GPU ids (got {value!r})")
        if config.device == "cpu":  # SERVER.md §2: ignored in CPU mode
            return
        for index, gpu in enumerate(value):
            if not _is_int(gpu) or gpu < 0:
                raise InvalidConfigError(name, f"must hold GPU ids >= 0 (got {gpu!r})")
            if gpu in value[:index]:  # one GPU twice: two seats named alike, counted as two
                raise InvalidConfigError(name, f"names GPU {gpu} twice")
        return
    if not meta["repeatable"]:
        problem = _value_problem(setting, value)
        if problem:
            raise InvalidConfigError(name, problem)
        return
    if not isinstance(value, list):
        raise InvalidConfigError(name, f"must be a list of {_ITEMS[meta['kind']]}")
    for item in value:  # a text item's type is its ``problem``'s to judge
        if meta["kind"] == "path" and not isinstance(item, Path):
            raise InvalidConfigError(name, f"must hold paths (got {item!r})")
        problem = _value_problem(setting, item)
        if problem:
            raise InvalidConfigError(name, problem)


_ITEMS = {"path": "paths", "text": "strings"}


def validate(config: ServerConfig) -> None:
    """Every rule of SERVER.md §2 / EXTENSIONS.md / ROUTER.md §3 that needs no I/O: each
    declared setting's own, then those between settings."""
    for setting in flag_settings():
        _check_declared(config, setting)
    if config.device == FAKE_GPU_DEVICE and config.fake_gpu_count < 1:
        raise InvalidConfigError(
            "fake_gpu_count",
            f"must be >= 1 with device {FAKE_GPU_DEVICE!r}",
        )
    if not config.gpus and config.device in ("gpu", FAKE_GPU_DEVICE):
        raise InvalidConfigError("gpus", "must not be empty in GPU mode")
    if config.sandbox_readonly_paths and config.sandbox == "none":
        raise InvalidConfigError(
            "sandbox_readonly_paths",
            "requires sandbox 'auto' or 'bubblewrap'",
            "--sandbox-readonly-path requires --sandbox auto or bubblewrap",
        )

    _validate_router(config)

    if config.auth_token is not None:
        if not isinstance(config.auth_token, str) or not config.auth_token:
            raise InvalidConfigError("auth_token", "must be a non-empty string")
        try:  # a token file's text, checked as one (EXTENSIONS §6): here, not in create_app
            parse_tokens(config.auth_token)
        except ValueError as exc:
            raise InvalidConfigError("auth_token", str(exc)) from None
    if not isinstance(config.allowed_serialization, list):
        raise InvalidConfigError("allowed_serialization", "must be a list of format names")
    for name in config.allowed_serialization:
        if name not in SERIALIZATION_FORMATS:
            raise InvalidConfigError(
                "allowed_serialization",
                f"names an unknown format {name!r} (known: {', '.join(SERIALIZATION_FORMATS)})",
            )


def _validate_router(config: ServerConfig) -> None:
    """ROUTER.md §3: a node names both its router and itself, or neither."""
    if config.router_endpoint is not None and config.node_id is None:
        raise InvalidConfigError(
            "router_endpoint", "requires node_id", "--router requires --node-id"
        )
    if config.node_id is not None and config.router_endpoint is None:
        raise InvalidConfigError(
            "node_id", "requires router_endpoint", "--node-id requires --router"
        )
    if len(config.node_labels) > MAX_NODE_LABELS:
        raise InvalidConfigError("node_labels", f"must hold at most {MAX_NODE_LABELS} labels")
    keys = [label.partition("=")[0] for label in config.node_labels]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise InvalidConfigError("node_labels", f"gives the key {repeated[0]!r} twice", None)
    if config.node_labels and config.router_endpoint is None:
        raise InvalidConfigError(
            "node_labels", "requires router_endpoint", "--node-label requires --router"
        )


#: ROUTER §6: the bounds of labels (the built-in keys they may not shadow: BUILT_IN_KEYS).
MAX_NODE_LABELS = 16
_LABEL_KEY = re.compile(r"[a-z][a-z0-9_.-]{0,31}", re.ASCII)
_LABEL_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", re.ASCII)


def node_label_problem(value: object) -> str | None:
    """Why ``value`` is not a ``KEY=VALUE`` node label (ROUTER §6), or None."""
    if not isinstance(value, str) or "=" not in value:
        return f"must be KEY=VALUE (got {value!r})"
    key, _, text = value.partition("=")
    if not _LABEL_KEY.fullmatch(key):
        return f"key {key!r} must be 1-32 characters: a lowercase ASCII letter, then [a-z0-9_.-]"
    if key in BUILT_IN_KEYS:
        return f"key {key!r} is built in ({', '.join(BUILT_IN_KEYS)}); choose another"
    if not _LABEL_VALUE.fullmatch(text):
        return (
            f"value of {key!r} must be 1-64 characters: an ASCII letter or digit, "
            "then [A-Za-z0-9_.-]"
        )
    return None


def node_labels(config: ServerConfig) -> dict[str, str]:
    """The node's labels as a map (validated: keys are distinct)."""
    return dict(label.partition("=")[::2] for label in config.node_labels)


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
        if item.name in ("node_token", "metrics_token") and value is not None:
            value = REDACTED
        elif isinstance(value, Path):
            value = str(value)
        elif isinstance(value, list):
            value = [str(v) if isinstance(v, Path) else v for v in value]
        result[item.name] = value
    return result
