"""``kcoral run`` command line: options, server selection, ``--env``/``--fetch`` checks.

CLIENT_API.md §11. The command line is checked completely before anything else happens, so a
usage error (exit status 2) never contacts a server. The tools' own argument rules live in
``kcoral.run.tools``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import posixpath
import re
import tempfile
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kcoral.connection.server_address import server_url
from kcoral.protocol.paths import normalize_workspace_path
from kcoral.protocol.selector import Selector, SelectorError, parse_selector
from kcoral.protocol.sizes import parse_bytes
from kcoral.protocol.utf8_text import is_utf8
from kcoral.protocol.validate import MAX_GPU_COUNT
from kcoral.run.tools import TOOLS, Tool, UsageError, check_tool_args, get_tool

PROG = "kcoral run"
DEFAULT_TIMEOUT_SECONDS = 300
DEFAULT_OUTPUT_LIMIT_BYTES = 268435456

USAGE = f"usage: {PROG} TOOL [options] -- ARGS...\n"
_OPTIONS_HELP = """\
options (before the first '--'):
  --url URL               server or router URL (default: $KCORAL_URL); its token, if it
                          needs one, comes from $KCORAL_TOKEN
  --host HOST             server host (default 127.0.0.1 when only --port is given)
  --port PORT             server port (default 8000 when only --host is given)
  --timeout SECONDS       execution timeout, a positive integer (default 300; a
                          server allows at most its limit, 900 s by default)
  --output-limit-bytes SIZE
                          captured stdout/stderr per stream, bytes or K, M, G, T: 64K,
                          1M (default 256 MiB; a server keeps at most its limit, 16 MiB
                          by default)
  --send PATH             local file or directory to upload (repeatable)
  -e, --env NAME[=VALUE]  remote environment variable; bare NAME copies the local value
  --fetch PATH            file or directory to bring back, relative to the tool's
                          directory
  --out DIR               new local directory for returned files
  --select SELECTOR       through a router: run on a node that offers it
                          (gpu=h100,pool=big)
  --gpus N                run with a set of N GPUs, 1-8 (torchrun, NCCL); a GPU server's
                          default is one GPU
  -h, --help              show this help
"""
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_REFUSED_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "KCORAL_DIR"})
_VALUE_OPTIONS = {
    "--url": "url",
    "--host": "host",
    "--port": "port",
    "--timeout": "timeout",
    "--output-limit-bytes": "output_limit",
    "--send": "send",
    "--env": "env",
    "-e": "env",
    "--fetch": "fetch",
    "--out": "out",
    "--select": "select",
    "--gpus": "gpus",
}
_REPEATABLE = frozenset({"send", "env", "fetch"})


class HelpRequested(Exception):
    """``--help`` was given; the argument is the text to print."""


@dataclass
class RunOptions:
    """A checked ``kcoral run`` command line."""

    tool: Tool
    args: list[str]
    url: str
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS
    output_limit_bytes: int = DEFAULT_OUTPUT_LIMIT_BYTES
    send: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    fetch: list[str] = field(default_factory=list)
    out: str | None = None
    #: what the node that runs the tool must offer (EXTENSIONS §14); None: any node of the
    #: router's default kind, where a mixed fleet's other kinds were out of reach
    select: Selector | None = None
    #: ``options.gpu_count`` (PROTOCOL §6.5): the tool runs once with a set of this many
    #: GPUs; None sends none (one GPU on a GPU server, the CPU on a CPU server)
    gpu_count: int | None = None
    #: printed on stderr before running (e.g. --host/--port overriding KCORAL_URL)
    warnings: list[str] = field(default_factory=list)
    #: bytes of --send inputs (for the progress line)
    input_bytes: int = 0
    #: set by ``execute`` when the tool's output was already printed live (EXTENSIONS §7)
    output_streamed: bool = False
    #: set by ``build_program``: the tool's stderr goes to its stdout, one capture for both
    #: (the local two are one place: a terminal, ``2>&1``; spec ``merge_stderr``)
    merged_output: bool = False
    #: the most output per stream the server keeps (``/v1/info`` ``limits``), which clamps
    #: ``output_limit_bytes``; None when the server does not say
    server_output_limit_bytes: int | None = None
    #: the longest ``--timeout`` the server grants (``/v1/info`` ``limits``); None when the
    #: server does not say
    server_max_timeout_seconds: float | None = None
    #: set once the remote tool is known to have ended: an interrupt after that cancels
    #: nothing, it only stops the printing or the saving of what came back
    tool_ended: bool = False
    #: a submitted job still waits in the server's queue (no worker has taken it): an
    #: interrupt then cancels a run whose tool never started
    job_queued: bool = False
    #: the run reached the server (a job accepted, or an ``/execute`` request on its way);
    #: an interrupt before that, while the inputs are read or sent, started nothing
    submitted: bool = False
    #: a second interrupt stopped the wait for the job's cancel (``DELETE``)
    cancel_unconfirmed: bool = False
    #: the server ends a job nobody follows (``/v1/info`` feature ``cancel-unfollowed``):
    #: where it does not, what the run says of an abandoned job must not promise it
    unfollowed_cancelled: bool = True


def parse_command_line(argv: Sequence[str], environ: Mapping[str, str]) -> RunOptions:
    """Check the whole command line; ``UsageError`` or ``HelpRequested`` otherwise."""
    words = list(argv)
    if not words:
        # `kcoral run $TOOL` with an empty variable must fail, not pass for a success
        raise UsageError("missing tool")
    if words[0] in ("-h", "--help"):
        raise HelpRequested(general_help())
    if words[0].startswith("-"):
        # `kcoral run --url URL python ...`: it read "unknown tool '--url'"
        raise UsageError(
            f"option {words[0]} before the tool: the tool comes first, "
            f"kcoral run TOOL {words[0]} ... -- ARGS (tools: {', '.join(TOOLS)})"
        )
    tool = get_tool(words[0])
    values: dict[str, Any] = {}
    index = 1
    while True:
        if index >= len(words):
            raise UsageError("missing '--' before the tool's arguments")
        word = words[index]
        index += 1
        if word == "--":
            break
        if word in ("-h", "--help"):
            raise HelpRequested(tool_help(tool))
        name, value, index = _option_value(word, words, index)
        key = _VALUE_OPTIONS[name]
        if key in _REPEATABLE:
            values.setdefault(key, []).append(value)
        elif key in values:
            raise UsageError(f"option {name} given more than once")
        else:
            values[key] = value
    args = words[index:]
    for arg in args:
        if not is_utf8(arg):
            raise UsageError(f"tool argument {arg!r} is not valid UTF-8 (arguments go as text)")
    check_tool_args(tool, args)
    url, warnings = select_server(
        values.get("url"), values.get("host"), values.get("port"), environ
    )
    _check_token(environ)
    options = RunOptions(tool=tool, args=args, url=url, warnings=warnings)
    if "timeout" in values:
        options.timeout_seconds = _positive_int("--timeout", values["timeout"])
    if "output_limit" in values:
        options.output_limit_bytes = _positive_size("--output-limit-bytes", values["output_limit"])
    if "gpus" in values:
        # one message for every refused count: 0 read "a positive integer" and 9 "1-8"
        text = values["gpus"]
        if not (text.isascii() and text.isdigit() and 1 <= int(text) <= MAX_GPU_COUNT):
            raise UsageError(f"--gpus must be 1-{MAX_GPU_COUNT}, not {text!r}")
        options.gpu_count = int(text)
    options.send = list(values.get("send", []))
    options.env = parse_env(values.get("env", []), environ)
    options.fetch = parse_fetch(values.get("fetch", []))
    options.out = values.get("out")
    if "select" in values:
        try:
            options.select = parse_selector(values["select"])
        except SelectorError as exc:
            raise UsageError(f"--select: {exc}") from None
    _check_outputs(options)
    return options


def _option_value(word: str, words: list[str], index: int) -> tuple[str, str, int]:
    """Split ``--name=value``, ``--name value``, ``-eVALUE`` or ``-e VALUE``."""
    if word.startswith("--") and "=" in word:
        name, value = word.split("=", 1)
        if name in _VALUE_OPTIONS:
            return name, value, index
    elif word in _VALUE_OPTIONS:
        if index >= len(words) or words[index] == "--":
            raise UsageError(f"option {word} needs a value")
        return word, words[index], index + 1
    elif word.startswith("-e") and not word.startswith("--"):
        return "-e", word[2:], index
    if word.startswith("-"):
        # the tool's own option without the '--' before it is the likely mistake
        raise UsageError(
            f"unknown option {word.split('=', 1)[0]} (the tool's own options go after '--')"
        )
    raise UsageError(f"unexpected argument {word!r}: the tool's arguments go after '--'")


def _positive_int(option: str, text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) <= 0:
        raise UsageError(f"{option} must be a positive integer, not {text!r}")
    return int(text)


def _positive_size(option: str, text: str) -> int:
    """A size as ``kcoral server``'s size options take it (``1K``, ``16M``), above 0."""
    try:
        size = parse_bytes(text)
    except ValueError:
        size = 0
    decimal = _DECIMAL_UNIT.fullmatch(text)
    if decimal is not None and int(decimal.group(1)) > 0:
        # the one refusal a user cannot see the reason for: "10MB" is a size everywhere else
        number, unit = decimal.groups()
        raise UsageError(
            f"{option} {text!r} is ambiguous (decimal or binary?); sizes here are binary: "
            f"give {number}{unit.upper()} ({number} {unit.upper()}iB) or a number of bytes"
        )
    if size <= 0:
        raise UsageError(
            f"{option} must be a size above 0, in bytes or with K, M, G or T (binary): "
            f"64K, 16M; not {text!r}"
        )
    return size


#: a size with a unit that ``parse_bytes`` refuses as ambiguous (``10MB``, ``1gb``)
_DECIMAL_UNIT = re.compile(r"([0-9]+)([KMGT])B", re.ASCII | re.IGNORECASE)


def select_server(
    url: str | None, host: str | None, port: str | None, environ: Mapping[str, str]
) -> tuple[str, list[str]]:
    """The base URL to use and any warning about it (CLIENT_API §11, server selection)."""
    if url is not None and (host is not None or port is not None):
        raise UsageError("--url cannot be combined with --host/--port")
    if host is not None or port is not None:
        host_text = "127.0.0.1" if host is None else host
        port_text = "8000" if port is None else port
        address = f"http://{_check_host(host_text)}:{_check_port(port_text)}"
        warnings = []
        if environ.get("KCORAL_URL"):
            warnings.append(f"--host/--port override KCORAL_URL; using {address}")
        return address, warnings
    if url is None:
        url = environ.get("KCORAL_URL") or None
        if url is None:
            raise UsageError("no server given: use --url, --host/--port or set KCORAL_URL")
        return _check_url(url, "KCORAL_URL"), []
    return _check_url(url, "--url"), []


def _check_token(environ: Mapping[str, str]) -> None:
    """A ``KCORAL_TOKEN`` that no request can carry (a space in it, as in a pasted
    ``Bearer ...``) is a usage error like a bad ``KCORAL_URL``: the client's ``ValueError``
    ended ``kcoral run`` with a traceback."""
    from kcoral.base_client import TOKEN_ENV, bearer_token

    token = environ.get(TOKEN_ENV)
    if token:
        try:
            bearer_token(token, TOKEN_ENV)
        except ValueError as exc:
            raise UsageError(str(exc)) from None


def _check_url(url: str, source: str) -> str:
    """The URL ``url`` names, by the address rule every entry point shares (CLIENT_API §2)."""
    try:
        return server_url(url)
    except ValueError as exc:
        raise UsageError(f"{source} is not a valid server address: {exc}") from None


def _check_host(host: str) -> str:
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if ":" in bare:
        try:
            ipaddress.IPv6Address(bare)
        except ValueError:
            raise UsageError(f"--host {host!r} is not a host name or IP address") from None
        return "[" + bare.replace("%", "%25") + "]"
    if not host or "://" in host or any(char in "/:@?#\\[]%" or char.isspace() for char in host):
        raise UsageError(
            f"--host {host!r} must be a host name or IP address (no scheme, port or path)"
        )
    return host


def _check_port(port: str) -> int:
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise UsageError(f"--port must be an integer in 1-65535, not {port!r}")
    return int(port)


def parse_env(assignments: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """``NAME[=VALUE]`` words -> overrides; the last assignment of a name wins."""
    result: dict[str, str] = {}
    for assignment in assignments:
        name, has_value, value = assignment.partition("=")
        if not _ENV_NAME.fullmatch(name):
            raise UsageError(f"--env: invalid variable name {name!r}")
        if name in _REFUSED_ENV:
            raise UsageError(f"--env: {name} cannot be set (the server manages it)")
        if not has_value:
            if name not in environ:
                raise UsageError(f"--env: {name} is not set locally")
            value = environ[name]
        if "\x00" in value:
            raise UsageError(f"--env: the value of {name} contains NUL")
        if not is_utf8(value):
            raise UsageError(f"--env: the value of {name} is not valid UTF-8")
        result.pop(name, None)
        result[name] = value
    return result


def parse_fetch(paths: Sequence[str]) -> list[str]:
    """Normalized ``--fetch`` paths (relative, no ``..``, no backslash)."""
    result = []
    for path in paths:
        if path and posixpath.normpath(path) == ".":
            # it read "path '.' is empty after normalization", true and no help
            raise UsageError(
                f"--fetch {path!r}: name a file or folder in the tool's directory, not the "
                "directory itself"
            )
        try:
            result.append(normalize_workspace_path(path))
        except ValueError as exc:
            raise UsageError(f"--fetch {path!r}: {exc}") from None
    return result


def _check_outputs(options: RunOptions) -> None:
    tool = options.tool
    if options.fetch and not tool.allows_fetch:
        raise UsageError(f"{tool.name} does not take --fetch (its outputs come back in --out)")
    if tool.requires_out and options.out is None:
        raise UsageError(f"{tool.name} requires --out DIR")
    if not tool.requires_out and bool(options.fetch) != (options.out is not None):
        raise UsageError("--fetch and --out must be given together")
    if options.out is not None:
        given, options.out = options.out, _out_path(options.out)
        if os.path.lexists(options.out):
            raise UsageError(f"--out {options.out!r} already exists (nothing is overwritten)")
        _try_out(given, options.out)


def _out_path(given: str) -> str:
    """``--out`` as the absolute path it names, its parent resolved (symlinks and ``..``
    as the shell would take them), before anything runs: the outputs are saved without
    following links, so ``lnk/prof``, ``../prof`` or ``prof/`` would only fail after the
    whole remote run. The parent is the user's own choice, never the server's."""
    if not given:
        raise UsageError("--out must not be empty")
    if not is_utf8(given):
        raise UsageError(f"--out {given!r} is not valid UTF-8")
    parent, name = os.path.split(given.rstrip("/"))
    if name in ("", ".", ".."):
        raise UsageError(f"--out {given!r} names no new directory")
    out = os.path.join(os.path.realpath(parent or os.curdir), name)
    _check_out_parent(given, out)
    return out


def _check_out_parent(given: str, out: str) -> None:
    """The nearest existing ancestor of ``out`` must be a directory this user may create
    entries in: a file there (``--out results.txt/prof``) or a read-only directory would
    otherwise only fail once the remote run is over, its outputs lost."""
    ancestor = os.path.dirname(out)
    while not os.path.lexists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise UsageError(f"--out {given!r}: {ancestor!r} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise UsageError(f"--out {given!r}: cannot create anything in {ancestor!r}")


def _try_out(given: str, out: str) -> None:
    """Make ``out`` (and its missing parents) and a file in it, then remove them: what the
    permission bits allow is not all, as root may write any directory's bits and still not
    create in ``/proc``, where the tool ran and the save then failed with ``[Errno 2] No
    such file or directory: 'x'``. Nothing is left behind, so ``--out`` still appears only
    where something comes back."""
    missing = []
    path = out
    while not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    made: list[str] = []
    doing = "write a file in it"
    try:
        for directory in reversed(missing):
            os.mkdir(directory, 0o700)
            made.append(directory)
        descriptor, probe = tempfile.mkstemp(dir=out)
        os.close(descriptor)
        os.unlink(probe)
    except OSError as exc:
        if len(made) < len(missing):
            doing = "create it" if exc.filename == out else f"create {exc.filename!r}"
        reason = exc.strerror or str(exc)
        raise UsageError(f"--out {given!r}: cannot {doing} here ({reason})") from None
    finally:
        for directory in reversed(made):
            with contextlib.suppress(OSError):
                os.rmdir(directory)


def general_help() -> str:
    tools = "".join(f"  {tool.name:<18}{tool.synopsis}\n" for tool in TOOLS.values())
    return (
        f"{USAGE}\nRun a command-line tool on a KCoral worker and bring its output back.\n\n"
        f"tools:\n{tools}\n{_OPTIONS_HELP}\n"
        "Exit status: the tool's own status (128 + N when killed by signal N), or 1 where\n"
        "it exited 0 but a requested output did not come back; 1 when the server could not\n"
        "be reached, a --send input could not be sent or the run failed before the tool's\n"
        "status came back; 130 after Ctrl-C; 2 for an invalid command line. See\n"
        "`kcoral run TOOL --help`.\n"
    )


#: the width of the help's lines, to which each tool's description is wrapped: they were
#: one line of up to 178 characters, which a terminal cut anywhere
HELP_WIDTH = 88


def tool_help(tool: Tool) -> str:
    return (
        f"usage: {PROG} {tool.name} [options] -- {tool.synopsis}\n\n"
        f"{textwrap.fill(tool.description, HELP_WIDTH, break_on_hyphens=False)}\n\n"
        f"{_OPTIONS_HELP}"
    )
