"""``kcoral run TOOL [options] -- ARGS…``: one command-line tool on a remote worker.

CLIENT_API.md §11. The work is one ordinary program built with the public client API: the
runner module of ``kcoral.run.worker_side``, the inputs as one ``bytes`` upload, one ``run`` whose
value says how the tool ended, and with ``--out`` one folder return. The command line is
checked by ``kcoral.run.arguments``, inputs are read by ``kcoral.run.inputs`` and the result is
reported by ``kcoral.run.outputs``.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any, TypeGuard

from kcoral.base_client import NO_TOKEN_SENT, token_refusal
from kcoral.connection.request_limit import RequestTooLarge
from kcoral.connection.server_address import path_not_served_hint
from kcoral.errors import (
    KCoralError,
    ProtocolError,
    TransportError,
    root_reason,
    unreachable_message,
)
from kcoral.local_folder import FileBlob, SentFileChanged
from kcoral.protocol.headers import CANCEL_UNFOLLOWED_HEADER
from kcoral.protocol.selector import NO_MATCHING_NODE
from kcoral.response import gpus_label
from kcoral.run import worker_outputs, worker_tree
from kcoral.run import worker_side as run_remote
from kcoral.run.arguments import PROG, USAGE, HelpRequested, RunOptions, parse_command_line
from kcoral.run.before_sending import empty_folders, unrunnable_executable, unsent_script
from kcoral.run.gpu_wait import GpuWaitNotice
from kcoral.run.inputs import (
    LocalFileError,
    changed_input,
    collect_inputs,
    split_inputs,
)
from kcoral.run.mid_run import (
    LOST_JOB,
    SELECTOR_WORD,
    UNFOLLOWED_CANCEL_SECONDS,
    ConnectionLostMidRun,
    GpusBeyondTheServer,
    GpusOnACpuServer,
    JobLost,
    TokenRefusedMidRun,
    gpu_kinds,
)
from kcoral.run.outputs import (
    OUTPUTS_KEY,
    STATUS_KEY,
    report,
    restore_terminal,
    say,
    say_truncated,
    start_on_a_new_line,
    write_in_order,
    write_output,
)
from kcoral.run.progress import Progress, format_bytes
from kcoral.run.standard_input import UNSENT_INPUT_WARNING, unsent_input_waiting
from kcoral.run.tools import UsageError


def main(argv: Sequence[str]) -> int:
    """Entry point of ``kcoral run``; returns the exit status."""
    start_on_a_new_line()
    try:
        options = parse_command_line(argv, os.environ)
    except HelpRequested as help_text:
        sys.stdout.write(str(help_text))
        return 0
    except UsageError as exc:
        sys.stderr.write(f"{PROG}: error: {exc}\n{USAGE}")
        return 2
    for warning in options.warnings:
        say(f"warning: {warning}")
    if unsent_input_waiting():
        say(f"warning: {UNSENT_INPUT_WARNING}")
    try:
        with _termination_signals():
            return run(options)
    except Terminated as stop:
        _say_last(f"terminated by {signal.Signals(stop.signum).name}; {_interrupted(options)}")
        return 128 + stop.signum
    except BrokenPipeError:
        # `kcoral run ... | head`: the reader is gone, so the remote tool was cancelled and
        # kcoral run ends as a local tool would, by SIGPIPE's status and without a word
        _discard_stdout()
        return 128 + SIGPIPE
    except KeyboardInterrupt:
        # A job was cancelled with DELETE; a plain /execute had its connection closed,
        # which makes the server cancel the tool (EXTENSIONS §9).
        _say_last(f"interrupted; {_interrupted(options)}")
        return 130
    finally:
        with contextlib.suppress(OSError):  # a closed terminal: nothing left to restore
            restore_terminal()


def _say_last(message: str) -> None:
    """Say how an interrupted run ended, where a terminal may be gone: a closed one (its
    SIGHUP) fails every write with EIO, which raised here and ended ``kcoral run`` with
    status 1 instead of 129. The status then says it alone, and both streams go to the null
    device so that flushing them at exit cannot fail (status 120) either."""
    try:
        say(message)
    except OSError:
        _discard_stdout()
        _discard_stream(sys.stderr)


def _interrupted(options: RunOptions) -> str:
    """What an interrupt did: start nothing (the inputs were still read or sent), cancel a
    queued run or the remote tool, or (once it had ended) only stop the saving of its
    outputs, which ``ReturnedFolder.save`` removes when cut short."""
    if not options.submitted:
        return "nothing was started on the server"
    if options.cancel_unconfirmed and not options.unfollowed_cancelled:
        return "the cancel was not confirmed (interrupted again); the remote tool may run on"
    if options.cancel_unconfirmed:
        return (
            "the cancel was not confirmed (interrupted again); the server ends the remote "
            f"tool within {UNFOLLOWED_CANCEL_SECONDS} s"
        )
    if options.job_queued:
        return "the queued run was cancelled before a worker took it"
    if not options.tool_ended:
        return "the remote tool was cancelled"
    if options.out is not None:
        return f"the remote tool had ended; its outputs were not saved to {options.out!r}"
    return "the remote tool had ended"


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: it ends ``kcoral run`` as Ctrl-C does, remote tool
    cancelled, instead of killing the process and leaving a submitted job running."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _termination_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP (a closed terminal, ``timeout``, ``kill``) raise ``Terminated``
    while ``kcoral run`` works; a disposition other than the default (``nohup``'s ignored
    SIGHUP) is kept, and the previous handlers come back at the end."""
    previous: dict[int, Any] = {}

    def terminate(signum: int, _frame: object) -> None:
        raise Terminated(signum)

    if threading.current_thread() is threading.main_thread():
        for name in ("SIGTERM", "SIGHUP"):
            number = getattr(signal, name, None)
            if number is not None and signal.getsignal(number) == signal.SIG_DFL:
                previous[number] = signal.signal(number, terminate)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


#: SIGPIPE's number (13 on Linux and macOS; the module has no SIGPIPE on Windows)
SIGPIPE = getattr(signal, "SIGPIPE", 13)


def _discard_stdout() -> None:
    """Point stdout at the null device, so that flushing it at exit cannot fail again."""
    _discard_stream(sys.stdout)


def _discard_stream(stream: Any) -> None:
    """Point ``stream``'s descriptor at the null device."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)


#: the modules uploaded together as the one runner module, each after those it imports
RUNNER_MODULES = (worker_tree, worker_outputs, run_remote)


def runner_source() -> str:
    """Source of the module that runs on the worker: the runner modules in one, without
    their imports of each other (an uploaded module imports no other upload, and the
    server may have no ``kcoral``) and with one ``__future__`` import, at the top."""
    parts = []
    for index, module in enumerate(RUNNER_MODULES):
        lines = inspect.getsource(module).splitlines(keepends=True)
        for node in reversed(ast.parse("".join(lines)).body):
            if isinstance(node, ast.ImportFrom) and (
                (node.module or "").startswith("kcoral.")
                or (node.module == "__future__" and index > 0)
            ):
                del lines[node.lineno - 1 : node.end_lineno]
        parts.append("".join(lines))
    return "\n\n".join(parts)


def build_program(options: RunOptions, inputs: Sequence[tuple[str, FileBlob, bool]]) -> Any:
    """The one program of an invocation (a ``kcoral.Program``): small inputs packed in one
    ``bytes`` upload, the others file uploads below the tool's directory, each read from its
    local file only as the request sends it (``split_inputs``)."""
    from kcoral.program import Program

    program = Program()
    module = program.upload(kind="module", source=runner_source(), id="runner")
    function = program.get_function(module=module, name="run_tool", id="run_tool")
    packed, uploaded = split_inputs(inputs)
    inputs_arg: Any = None
    if packed:
        inputs_arg = program.upload(kind="bytes", value=run_remote.pack_inputs(packed), id="inputs")
    for remote, blob, _executable in uploaded:
        program.upload_file(blob=blob, path=f"{run_remote.WORK_DIR}/{remote}")
    options.merged_output = output_shares_one_place()  # the truncation note says it too
    spec = {
        # a file upload's mode is the server's: the runner sets 0700 or 0600 (§11)
        "inputs": [[remote, executable] for remote, _blob, executable in uploaded],
        "tool": options.tool.name,
        "args": list(options.args),
        "env": dict(options.env),
        "fetch": list(options.fetch),
        "collect": options.out is not None,
        "merge_stderr": options.merged_output,
    }
    status = program.run(fn=function, args=[inputs_arg, spec], id=STATUS_KEY)
    program.return_(key=STATUS_KEY, value=status)
    if options.out is not None:
        program.return_folder(key=OUTPUTS_KEY, path=run_remote.OUTPUTS_DIR)
    return program


def output_shares_one_place() -> bool:
    """Whether the local stdout and stderr are one place (the same terminal, pipe or file:
    `2>&1`), where the order between the tool's two streams shows and only one capture
    keeps it (CLIENT_API §11)."""
    try:
        out, err = os.fstat(sys.stdout.fileno()), os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):  # closed, or not a real descriptor
        return False
    return (out.st_dev, out.st_ino) == (err.st_dev, err.st_ino)


def run(options: RunOptions) -> int:
    """Send the inputs, run the tool remotely, print its output; returns the exit status."""
    try:
        files = collect_inputs(options.send)
    except LocalFileError as exc:
        say(str(exc))
        return 1
    for warning in empty_folders(options.send, files):
        say(warning)
    missing = unsent_script(options, [path for path, _data, _executable in files])
    missing = missing or unrunnable_executable(options, files)
    if missing:
        say(missing)
        return 2
    options.input_bytes = sum(blob.size for _path, blob, _executable in files)
    try:
        program = build_program(options, files)
        result = execute(options, program)
        options.tool_ended = True
    except (JobLost, TokenRefusedMidRun, ConnectionLostMidRun, GpusOnACpuServer) as lost:
        say(str(lost))
        return 1
    except SentFileChanged as changed:  # the request was cut before its body was complete
        say(changed_input(changed))
        return 1
    except KCoralError as exc:
        if exc.status_code == 504 and exc.kind == "timeout":
            if exc.output is not None:
                # what the tool printed before its deadline (EXTENSIONS §15), then why it ended
                if not options.output_streamed:
                    write_in_order(exc.output)
                say_truncated(options, exc.output)
            say(timed_out(options))
            return 1
        say(str(_gpus_beyond(exc, options) or server_error(exc, options.url)))
        return 1
    except TransportError as exc:
        # The client's one line (the address and the reason, not urllib3's chain of
        # wrappers), for the address as the user gave it.
        say(unreachable_message(options.url, exc))
        return 1
    except ProtocolError as exc:
        say(f"invalid response from the server: {exc}")
        return 1
    return report(options, result)


#: PROTOCOL §7.1: the 503 of a server that is closing (a prefix: a tail may follow)
_SHUTTING_DOWN = "server saturated: the server is shutting down"
#: ROUTER §7 step 3: a stopping router's answer to a request it no longer queues
_ROUTER_STOPPING = "the router is shutting down"


def server_error(exc: KCoralError, url: str) -> str:
    """An HTTP error as one line; an answer without a KCoral error body is said to be one.
    Before, it read "server error: HTTP 501: HTTP 501". A redirect says where it pointed
    (never followed: ``kcoral.response.redirect_hint``)."""
    if exc.without_error_body and 300 <= exc.status_code < 400 and exc.hint:
        return f"{url}: {exc.hint}"
    if exc.without_error_body:
        return (
            f"{url} answered HTTP {exc.status_code} without a KCoral error: is it a KCoral "
            "server (or a proxy in front of one)?"
        )
    if isinstance(exc, RequestTooLarge):  # refused here, unsent: no server said it
        # the body is the --send inputs (and the small runner): "request not sent: its body
        # of ..." spoke of HTTP to someone who had named files
        return (
            f"the --send inputs come to {format_bytes(exc.length)} in the request, over "
            f"{exc.over}; nothing was sent"
        )
    if exc.status_code == 401:  # the one refusal the user fixes on this side
        # its own hint, not the client's (which says ``Client(url, token=...)``), saying
        # which of the two it was: "missing or invalid bearer token" left a KCORAL_TOKEN
        # set without `export` (so never sent) to look like a wrong token
        if token_refusal(exc) == NO_TOKEN_SENT:
            return (
                "the server needs a token (HTTP 401), and KCORAL_TOKEN is unset or empty "
                "here: export KCORAL_TOKEN=<a token it accepts>"
            )
        return (
            "the server refused the token in KCORAL_TOKEN (HTTP 401): set KCORAL_TOKEN to a "
            "token it accepts"
        )
    wrong_path = path_not_served_hint(url) if exc.status_code == 404 else ""
    if wrong_path and exc.kind == "not_found":  # a job's own 404 is JobLost, not this
        return f"server error: {exc}; {wrong_path}"
    if (exc.status_code, exc.kind) == (503, "busy") and exc.message.startswith(_SHUTTING_DOWN):
        # The server's message keeps PROTOCOL §7.1's "server saturated: " prefix, which says
        # nothing true of a server closing, nor what to do; nothing of the run was admitted.
        return "the server is shutting down and did not run the tool; run again once it is back"
    if (exc.status_code, exc.kind) == (503, "no_node") and exc.message == _ROUTER_STOPPING:
        return "the router is shutting down and did not run the tool; run again once it is back"
    if (exc.status_code, exc.kind) == (503, NO_MATCHING_NODE):
        # the --select the user gave, not a server failing (EXTENSIONS §14)
        return f"{exc.message}; nothing was run"
    if exc.status_code == 409 and exc.kind == "cancelled":
        # Not the server failing: someone cancelled the job (an admin, a revoked token), and
        # the server's message says who or why.
        return f"the tool was stopped: {exc.message}"
    return f"server error: {exc}"


def _gpus_beyond(exc: KCoralError, options: RunOptions) -> GpusBeyondTheServer | None:
    """A refused ``--gpus`` said with how many GPUs the server has (one ``/health`` request,
    made only now); None for other refusals, or where the server does not say."""
    refused = (exc.status_code, exc.kind) == (400, "parse")
    if not refused or options.gpu_count is None or not exc.message.startswith("gpu_count"):
        return None
    from kcoral.client import Client

    try:
        with Client(options.url) as client:
            health = client.health()
    except (KCoralError, TransportError, ProtocolError):
        return None
    count = health.get("gpu_count")
    if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
        return None
    target = health.get("target")
    arch = target.get("arch") if isinstance(target, dict) else None
    # a name fit to be shown (sm_90a): a server's words reach the terminal, at any length
    shown = arch if isinstance(arch, str) and SELECTOR_WORD.fullmatch(arch) else None
    return GpusBeyondTheServer(options.gpu_count, options.url, gpus_label(count, shown))


def timed_out(options: RunOptions) -> str:
    """The tool ran past its deadline (a 504 ``timeout``), in the words of the option the
    user typed: the server's line (``execution timed out after its deadline of 2 s (the
    program's timeout_seconds; --max-timeout-seconds allows 900 s)``) named two settings
    of its own, and kcoral run added a third clause to say which option was meant."""
    # the worker is killed at the deadline, so nothing of --fetch comes back: the user
    # looked for an --out that was never made
    stopped = "the tool was stopped" + (
        ", and nothing was fetched" if options.out is not None else ""
    )
    most = options.server_max_timeout_seconds
    if most is not None and options.timeout_seconds > most:
        return (
            f"timed out after {most:g} s on the worker, this server's most (--timeout "
            f"{options.timeout_seconds} was cut to it); {stopped}"
        )
    return f"timed out after --timeout {options.timeout_seconds} s on the worker; {stopped}"


def execute(options: RunOptions, program: Any) -> Any:
    """Run ``program`` and return its ``ProgramResult``.

    When the server lists feature ``jobs`` (EXTENSIONS §7) the program is submitted as a
    job and its stdout/stderr are printed while it runs (``options.output_streamed``);
    Ctrl-C then cancels the job. Otherwise the output arrives with the response.
    """
    from kcoral.client import Client

    progress = Progress(f"{PROG}: sending inputs", options.input_bytes, sys.stderr, waiting=True)
    # A job of ours that no one follows for a while ends (EXTENSIONS §7): a client killed
    # outright (SIGKILL, the OOM killer) cancels nothing itself, and its job ran on to its
    # deadline while nothing had said its id. Other requests ignore the header.
    cancel_unfollowed = {CANCEL_UNFOLLOWED_HEADER: str(UNFOLLOWED_CANCEL_SECONDS)}
    with Client(options.url, headers=cancel_unfollowed) as client:
        info = _server_info(client)
        options.unfollowed_cancelled = _offers(info, "cancel-unfollowed")
        options.server_output_limit_bytes = _max_output_limit(info)
        _warn_of_a_clamped_timeout(options, info)
        # With --select a router's /v1/info (sent without the selector; its ``fleet`` marks
        # a router, ROUTER §13) describes its default kind: a CPU one said nothing of a GPU
        # node selected. A direct server is the node the selector is matched against.
        routed = options.select is not None and "fleet" in info
        if options.gpu_count is not None and not routed and info.get("device") == "cpu":
            raise GpusOnACpuServer(options.gpu_count, gpu_kinds(info))
        if not _offers_jobs(info):
            options.submitted = True  # the tool may start before the answer comes
            with progress:
                return client.execute(
                    program,
                    timeout_seconds=options.timeout_seconds,
                    output_limit_bytes=options.output_limit_bytes,
                    gpu_count=options.gpu_count,
                    select=options.select,
                )
        with progress:
            job = client.submit(
                program,
                timeout_seconds=options.timeout_seconds,
                output_limit_bytes=options.output_limit_bytes,
                gpu_count=options.gpu_count,
                select=options.select,
            )
        # First in line (position 0) is also a wait when every worker is busy, and that
        # printed nothing either: said only if no worker has taken the job after a moment.
        first_in_line = threading.Timer(WAITING_NOTICE_SECONDS, say, [WAITING_NOTICE])
        first_in_line.daemon = True
        gpu_wait = GpuWaitNotice(options.gpu_count, say)
        options.submitted = options.job_queued = True
        try:
            queued_said = False
            for event in job.events():
                if event.kind == "stdout":
                    write_output(sys.stdout, event.text)
                elif event.kind == "stderr":
                    write_output(sys.stderr, event.text)
                elif not _is_queued(event.data):
                    first_in_line.cancel()  # assigned (or finished): no longer waiting
                    options.job_queued = False
                    if event.kind == "phase" and isinstance(event.data, dict):
                        gpu_wait.seen(event.data)
                elif not queued_said and (ahead := _requests_ahead(event.data)):
                    # Said once: a wait behind others, which printed nothing, looked hung
                    # (team soak).
                    first_in_line.cancel()
                    other = "other request" if ahead == 1 else "other requests"
                    say(f"queued behind {ahead} {other}; the tool starts when a worker is free")
                    queued_said = True
                elif not queued_said and not first_in_line.is_alive():
                    first_in_line.start()
                    queued_said = True
            options.output_streamed = True
            options.tool_ended = True  # the stream ends after the job's finished phase
            return job.result()
        except KCoralError as exc:
            if exc.status_code == 404:
                # the job was accepted, so the server (or the router's node) has lost it
                expired = exc.message if exc.kind == "job_expired" else None
                lost = exc.message if exc.message.startswith(LOST_JOB) else None
                raise JobLost(expired, lost) from exc
            if exc.status_code == 401:  # it was accepted: the token changed since
                raise TokenRefusedMidRun(job.id, options.url, options.unfollowed_cancelled) from exc
            raise
        except TransportError as exc:
            # the job was accepted, and the reconnects of its event stream all failed
            raise ConnectionLostMidRun(
                job.id, options.url, root_reason(exc), options.unfollowed_cancelled
            ) from exc
        except (KeyboardInterrupt, BrokenPipeError):
            # Ctrl-C, SIGTERM/SIGHUP, or the local reader of the output went away
            try:
                with contextlib.suppress(Exception):
                    ended = job.cancel()  # waits until the remote process tree is gone
                    if ended.get("started_at") is not None:  # a worker took it meanwhile
                        options.job_queued = False
            except KeyboardInterrupt:
                # A second Ctrl-C stops the wait for the cancel: it said the tool was
                # cancelled, unconfirmed. The server ends it anyway once unfollowed.
                options.cancel_unconfirmed = True
            raise
        finally:
            first_in_line.cancel()
            gpu_wait.cancel()


#: How long a job first in line may wait for a worker before ``kcoral run`` says it waits.
WAITING_NOTICE_SECONDS = 1.0
WAITING_NOTICE = "waiting for a free worker; the tool starts when one is free"


def _is_queued(phase: object) -> TypeGuard[dict[str, Any]]:
    return isinstance(phase, dict) and phase.get("phase") == "queued"


def _requests_ahead(phase: object) -> int:
    """The requests served before a job, from its ``queued`` phase (EXTENSIONS §5); 0 for
    any other event, or a position a server got wrong."""
    if not _is_queued(phase):
        return 0
    position = phase.get("position")
    if isinstance(position, bool) or not isinstance(position, int):
        return 0
    return position if 0 < position < 2**31 else 0


def _server_info(client: Any) -> dict[str, Any]:
    """``/v1/info``, or an empty dict from a server without it. A 503 is raised: a router
    without a ready node answers it so (kind ``no_node``), and taking it for a server
    without jobs sent the run as ``/execute``, which waited minutes for a node without a
    word."""
    try:
        info = client.info()
    except KCoralError as exc:
        if exc.status_code == 503:
            raise
        return {}
    return info if isinstance(info, dict) else {}


def _offers_jobs(info: dict[str, Any]) -> bool:
    """Whether ``/v1/info`` lists ``jobs`` (a server without ``/v1/info`` has none)."""
    return _offers(info, "jobs")


def _offers(info: dict[str, Any], feature: str) -> bool:
    """Whether ``/v1/info`` lists ``feature``."""
    features = info.get("features")
    return isinstance(features, list) and feature in features


def _warn_of_a_clamped_timeout(options: RunOptions, info: dict[str, Any]) -> None:
    """Say before the run when the server will cut ``--timeout`` to its most: it did so
    without a word, and a long tool learned it only when it was killed there."""
    limits = info.get("limits")
    most = limits.get("max_timeout_seconds") if isinstance(limits, dict) else None
    if isinstance(most, bool) or not isinstance(most, (int, float)) or most <= 0:
        return
    options.server_max_timeout_seconds = most
    if options.timeout_seconds > most:
        say(
            f"warning: --timeout {options.timeout_seconds} is over this server's most, "
            f"{most:g} s (kcoral server --max-timeout-seconds): the tool gets {most:g} s"
        )


def _max_output_limit(info: dict[str, Any]) -> int | None:
    """The server's ``max_output_limit_bytes``, which clamps ``--output-limit-bytes``."""
    limits = info.get("limits")
    value = limits.get("max_output_limit_bytes") if isinstance(limits, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
