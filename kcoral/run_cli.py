"""``kcoral run TOOL [options] -- ARGS…``: one command-line tool on a remote worker.

CLIENT_API.md §11. The command line is checked completely before anything else happens, so a
usage error (exit status 2) never contacts a server. The work is one ordinary program built
with the public client API: the runner module of ``kcoral.run_remote``, the inputs as one
``bytes`` upload, one ``run`` whose value says how the tool ended, and with ``--out`` one
folder return.
"""

from __future__ import annotations

import contextlib
import inspect
import ipaddress
import itertools
import os
import re
import stat
import sys
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from kcoral import run_remote
from kcoral.errors import KCoralError, ProtocolError, TransportError
from kcoral.progress import Progress
from kcoral.protocol.paths import normalize_workspace_path
from kcoral.run_tools import TOOLS, Tool, UsageError, check_tool_args, get_tool

DEFAULT_TIMEOUT_SECONDS = 300
DEFAULT_OUTPUT_LIMIT_BYTES = 268435456
STATUS_KEY = "status"
OUTPUTS_KEY = "outputs"

_PROG = "kcoral run"
_USAGE = f"usage: {_PROG} TOOL [options] -- ARGS...\n"
_OPTIONS_HELP = """\
options (before the first '--'):
  --url URL               server or router URL (default: $KCORAL_URL)
  --host HOST             server host (default 127.0.0.1 when only --port is given)
  --port PORT             server port (default 8000 when only --host is given)
  --timeout SECONDS       execution timeout, a positive integer (default 300)
  --output-limit-bytes N  captured stdout/stderr limit per stream (default 268435456)
  --send PATH             local file or directory to upload (repeatable)
  -e, --env NAME[=VALUE]  remote environment variable; bare NAME copies the local value
  --fetch PATH            file or directory to bring back, relative to the tool's directory
  --out DIR               new local directory for returned files
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
}
_REPEATABLE = frozenset({"send", "env", "fetch"})


class HelpRequested(Exception):
    """``--help`` was given; the argument is the text to print."""


class LocalFileError(Exception):
    """An input that cannot be sent or an output that cannot be saved (exit status 1)."""


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
    #: printed on stderr before running (e.g. --host/--port overriding KCORAL_URL)
    warnings: list[str] = field(default_factory=list)
    #: bytes of --send inputs (for the progress line)
    input_bytes: int = 0
    #: set by ``execute`` when the tool's output was already printed live (EXTENSIONS §7)
    output_streamed: bool = False


def main(argv: Sequence[str]) -> int:
    """Entry point of ``kcoral run``; returns the exit status."""
    try:
        options = parse_command_line(argv, os.environ)
    except HelpRequested as help_text:
        sys.stdout.write(str(help_text))
        return 0
    except UsageError as exc:
        sys.stderr.write(f"{_PROG}: error: {exc}\n{_USAGE}")
        return 2
    for warning in options.warnings:
        _say(f"warning: {warning}")
    try:
        return run(options)
    except KeyboardInterrupt:
        # A job was cancelled with DELETE; a plain /execute had its connection closed,
        # which makes the server cancel the tool (EXTENSIONS §9).
        _say("interrupted; the remote tool was cancelled")
        return 130


def parse_command_line(argv: Sequence[str], environ: Mapping[str, str]) -> RunOptions:
    """Check the whole command line; ``UsageError`` or ``HelpRequested`` otherwise."""
    words = list(argv)
    if not words or words[0] in ("-h", "--help"):
        raise HelpRequested(general_help())
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
    check_tool_args(tool, args)
    url, warnings = select_server(
        values.get("url"), values.get("host"), values.get("port"), environ
    )
    options = RunOptions(tool=tool, args=args, url=url, warnings=warnings)
    if "timeout" in values:
        options.timeout_seconds = _positive_int("--timeout", values["timeout"])
    if "output_limit" in values:
        options.output_limit_bytes = _positive_int("--output-limit-bytes", values["output_limit"])
    options.send = list(values.get("send", []))
    options.env = parse_env(values.get("env", []), environ)
    options.fetch = parse_fetch(values.get("fetch", []))
    options.out = values.get("out")
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
        raise UsageError(f"unknown option {word.split('=', 1)[0]}")
    raise UsageError(f"unexpected argument {word!r}: the tool's arguments go after '--'")


def _positive_int(option: str, text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) <= 0:
        raise UsageError(f"{option} must be a positive integer, not {text!r}")
    return int(text)


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


def _check_url(url: str, source: str) -> str:
    problem = None
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for an invalid port
    except ValueError as exc:
        problem = str(exc)
    else:
        if parts.scheme not in ("http", "https"):
            problem = "it must start with http:// or https://"
        elif not parts.hostname:
            problem = "it has no host"
        elif parts.query or parts.fragment or "?" in url or "#" in url:
            problem = "it must not have a query or fragment"
        elif parts.username is not None or parts.password is not None:
            problem = "it must not contain credentials"
        elif any(char.isspace() for char in url):
            problem = "it must not contain whitespace"
    if problem:
        raise UsageError(f"{source} {url!r} is not a valid server URL: {problem}")
    return url.rstrip("/")


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
        result.pop(name, None)
        result[name] = value
    return result


def parse_fetch(paths: Sequence[str]) -> list[str]:
    """Normalized ``--fetch`` paths (relative, no ``..``, no backslash)."""
    result = []
    for path in paths:
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
        if not options.out:
            raise UsageError("--out must not be empty")
        if os.path.lexists(options.out):
            raise UsageError(f"--out {options.out!r} already exists (nothing is overwritten)")


def general_help() -> str:
    tools = "".join(f"  {tool.name:<18}{tool.synopsis}\n" for tool in TOOLS.values())
    return (
        f"{_USAGE}\nRun a command-line tool on a KCoral worker and bring its output back.\n\n"
        f"tools:\n{tools}\n{_OPTIONS_HELP}\n"
        "Exit status: the tool's own status (128 + N when killed by signal N); 1 when the\n"
        "program failed, the server could not be reached or a requested output is missing;\n"
        "2 for an invalid command line. See `kcoral run TOOL --help`.\n"
    )


def tool_help(tool: Tool) -> str:
    return (
        f"usage: {_PROG} {tool.name} [options] -- {tool.synopsis}\n\n"
        f"{tool.description}\n\n{_OPTIONS_HELP}"
    )


# --- inputs ------------------------------------------------------------------------------


def collect_inputs(paths: Sequence[str]) -> list[tuple[str, bytes, bool]]:
    """Read the ``--send`` files as ``(remote path, data, executable)``, sorted by path.

    A file goes under its base name, a directory under its own name with its layout;
    ``__pycache__`` entries and empty directories are skipped. Symlinks, special files, a
    directory reached twice, files changing while read and conflicting remote paths raise
    ``LocalFileError``.
    """
    files: dict[str, tuple[bytes, bool]] = {}
    for path in paths:
        name = os.path.basename(os.path.abspath(path))
        if not name:
            raise LocalFileError(f"--send {path!r}: cannot send the root directory")
        for remote, data, executable in _read_input(path, name):
            if remote in files:
                raise LocalFileError(f"--send: two inputs would both be sent as {remote!r}")
            files[remote] = (data, executable)
    names = sorted(files)
    for earlier, later in itertools.pairwise(names):
        if later.startswith(earlier + "/"):
            raise LocalFileError(
                f"--send: {earlier!r} is both a file and a directory in the inputs"
            )
    return [(name, *files[name]) for name in names]


def _read_input(path: str, name: str) -> list[tuple[str, bytes, bool]]:
    info = _lstat(path)
    if stat.S_ISREG(info.st_mode):
        return [(name, _read_file(path, info), bool(info.st_mode & stat.S_IXUSR))]
    if not stat.S_ISDIR(info.st_mode):
        raise LocalFileError(f"--send {path!r}: {_kind(info)} cannot be sent")
    result = []
    seen_dirs = {(info.st_dev, info.st_ino)}
    pending = [(path, name)]
    while pending:  # iterative: deep trees must not hit the recursion limit
        directory, remote_dir = pending.pop()
        try:
            entries = sorted(os.listdir(directory))
        except OSError as exc:
            raise LocalFileError(f"--send: cannot list {directory!r}: {exc.strerror}") from None
        for entry in entries:
            if entry == "__pycache__":
                continue
            local = os.path.join(directory, entry)
            remote = f"{remote_dir}/{entry}"
            entry_info = _lstat(local)
            if stat.S_ISDIR(entry_info.st_mode):
                key = (entry_info.st_dev, entry_info.st_ino)
                if key in seen_dirs:
                    raise LocalFileError(f"--send: directory {local!r} is reached twice")
                seen_dirs.add(key)
                pending.append((local, remote))
            elif stat.S_ISREG(entry_info.st_mode):
                executable = bool(entry_info.st_mode & stat.S_IXUSR)
                result.append((remote, _read_file(local, entry_info), executable))
            else:
                raise LocalFileError(f"--send: {local!r} is a {_kind(entry_info)}; refused")
    return result


def _lstat(path: str) -> os.stat_result:
    try:
        return os.lstat(path)
    except OSError as exc:
        raise LocalFileError(f"--send {path!r}: {exc.strerror}") from None


def _read_file(path: str, before: os.stat_result) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as handle:
            data = handle.read()
            after = os.fstat(handle.fileno())
    except OSError as exc:
        raise LocalFileError(f"--send: cannot read {path!r}: {exc.strerror}") from None
    changed = (before.st_size, before.st_mtime_ns, before.st_ino) != (
        after.st_size,
        after.st_mtime_ns,
        after.st_ino,
    )
    if changed or len(data) != after.st_size:
        raise LocalFileError(f"--send: {path!r} changed while it was read")
    return data


def _kind(info: os.stat_result) -> str:
    if stat.S_ISLNK(info.st_mode):
        return "symbolic link"
    if stat.S_ISFIFO(info.st_mode):
        return "FIFO"
    if stat.S_ISSOCK(info.st_mode):
        return "socket"
    if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode):
        return "device file"
    return "special file"


# --- the program and its outcome ----------------------------------------------------------


def runner_source() -> str:
    """Source of the module that runs on the worker."""
    return inspect.getsource(run_remote)


def build_program(options: RunOptions, inputs: bytes | None) -> Any:
    """The one program of an invocation (a ``kcoral.Program``)."""
    from kcoral.program import Program

    program = Program()
    module = program.upload(kind="module", source=runner_source(), id="runner")
    function = program.get_function(module=module, name="run_tool", id="run_tool")
    inputs_arg: Any = None
    if inputs:
        inputs_arg = program.upload(kind="bytes", value=inputs, id="inputs")
    spec = {
        "tool": options.tool.name,
        "args": list(options.args),
        "env": dict(options.env),
        "fetch": list(options.fetch),
        "collect": options.out is not None,
    }
    status = program.run(fn=function, args=[inputs_arg, spec], id=STATUS_KEY)
    program.return_(key=STATUS_KEY, value=status)
    if options.out is not None:
        program.return_folder(key=OUTPUTS_KEY, path=run_remote.OUTPUTS_DIR)
    return program


def run(options: RunOptions) -> int:
    """Send the inputs, run the tool remotely, print its output; returns the exit status."""
    try:
        files = collect_inputs(options.send)
    except LocalFileError as exc:
        _say(str(exc))
        return 1
    options.input_bytes = sum(len(data) for _path, data, _executable in files)
    inputs = run_remote.pack_inputs(files) if files else None
    program = build_program(options, inputs)
    try:
        result = execute(options, program)
    except KCoralError as exc:
        _say(f"server error: {exc}")
        return 1
    except TransportError as exc:
        _say(f"cannot reach the server at {options.url}: {exc}")
        return 1
    except ProtocolError as exc:
        _say(f"invalid response from the server: {exc}")
        return 1
    return report(options, result)


def execute(options: RunOptions, program: Any) -> Any:
    """Run ``program`` and return its ``ProgramResult``.

    When the server lists feature ``jobs`` (EXTENSIONS §7) the program is submitted as a
    job and its stdout/stderr are printed while it runs (``options.output_streamed``);
    Ctrl-C then cancels the job. Otherwise the output arrives with the response.
    """
    from kcoral.client import Client

    progress = Progress(f"{_PROG}: sending inputs", options.input_bytes, sys.stderr, waiting=True)
    with Client(options.url) as client:
        if not _offers_jobs(client):
            with progress:
                return client.execute(
                    program,
                    timeout_seconds=options.timeout_seconds,
                    output_limit_bytes=options.output_limit_bytes,
                )
        with progress:
            job = client.submit(
                program,
                timeout_seconds=options.timeout_seconds,
                output_limit_bytes=options.output_limit_bytes,
            )
        try:
            for event in job.events():
                if event.kind == "stdout":
                    _write(sys.stdout, event.text)
                elif event.kind == "stderr":
                    _write(sys.stderr, event.text)
            options.output_streamed = True
            return job.result()
        except KeyboardInterrupt:
            with contextlib.suppress(Exception):
                job.cancel()  # waits until the remote process tree is gone
            raise


def _offers_jobs(client: Any) -> bool:
    """Whether ``/v1/info`` lists ``jobs`` (a server without ``/v1/info`` has none)."""
    try:
        features = client.info().get("features")
    except KCoralError:
        return False
    return isinstance(features, list) and "jobs" in features


def report(options: RunOptions, result: Any) -> int:
    """Print the captured output, save returned files; returns the exit status."""
    if not options.output_streamed:
        _write(sys.stdout, result.stdout)
        _write(sys.stderr, result.stderr)
    for stream_name in ("stdout", "stderr"):
        if getattr(result, f"{stream_name}_truncated"):
            _say(
                f"the remote {stream_name} was truncated at the server's output limit "
                "(see --output-limit-bytes)"
            )
    if not result.completed:
        error = result.error or {}
        _say(
            f"remote program failed ({error.get('kind')}): {error.get('message')} "
            f"[request {result.request_id}]"
        )
        traceback = error.get("traceback")
        if traceback:
            sys.stderr.write(traceback if traceback.endswith("\n") else traceback + "\n")
        return 1
    outcome = result.results.get(STATUS_KEY)
    if not isinstance(outcome, dict):
        _say("invalid response from the server: the runner returned no status")
        return 1
    if outcome.get("error"):
        _say(str(outcome["error"]))
        return 1
    for skipped in outcome.get("skipped") or []:
        _say(f"warning: {skipped} is not a regular file or directory; not returned")
    status = _exit_status(outcome)
    if options.out is not None:
        if not _save_outputs(options.out, result.results.get(OUTPUTS_KEY)):
            return 1
    missing = outcome.get("missing") or []
    for item in missing:
        _say(f"missing output {item.get('path')}: {item.get('reason')}")
    if missing and status == 0:
        return 1
    return status


def _exit_status(outcome: Mapping[str, Any]) -> int:
    if isinstance(outcome.get("signal"), int):
        return 128 + outcome["signal"]
    if isinstance(outcome.get("exit_code"), int):
        # statuses beyond 255 cannot be process exit statuses; keep them non-zero
        code = outcome["exit_code"]
        return code if 0 <= code <= 255 else 1
    return 1


def _save_outputs(out: str, folder: Any) -> bool:
    if folder is None or not hasattr(folder, "save"):
        _say("invalid response from the server: the outputs folder is missing")
        return False
    total = sum(len(item.read_bytes()) for item in folder.files.values())
    try:
        parent = os.path.dirname(os.path.abspath(out))
        os.makedirs(parent, exist_ok=True)
        with Progress(f"{_PROG}: saving outputs", total, sys.stderr) as progress:
            folder.save(out)
            progress.advance(total)
    except (OSError, ValueError) as exc:
        _say(f"cannot save the outputs to {out!r}: {exc}")
        return False
    return True


def _write(stream: TextIO, text: str) -> None:
    if not text:
        return
    stream.flush()
    buffer = getattr(stream, "buffer", None)
    if buffer is not None:
        # bytes, so that a non-UTF-8 terminal locale cannot fail on the tool's output
        buffer.write(text.encode("utf-8", "surrogateescape"))
        buffer.flush()
    else:
        stream.write(text)
        stream.flush()


def _say(message: str) -> None:
    sys.stderr.write(f"{_PROG}: {message}\n")
    sys.stderr.flush()
