"""Every ``%%kcoral`` / ``%kcoral`` command's options, declared once as an argparse parser.

The same parsers read the command lines and render ``%kcoral --help`` (``help_text``), so
the help cannot drift from what is accepted. Options are never abbreviated
(``allow_abbrev=False``): ``--gpu 1`` is refused, not taken for ``--gpus 1``.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterable, Sequence
from typing import NoReturn

from IPython.core.error import UsageError

from kcoral.protocol.selector import SelectorError, format_selector, parse_selector

#: Options whose value is a comma-separated list of names ("-i a, b" is one value).
_LIST_OPTIONS = frozenset(("-i", "--in", "-o", "--out"))

CELL_EPILOG = """\
  Options are never abbreviated: --gpu is refused, not taken for --gpus.

Types: tensor -i values arrive as torch.Tensor where the server has torch (on the GPU of a GPU
server), else as NumPy arrays. Tensors come back in the library of the cell's -i tensors (NumPy
in, NumPy out; torch in, torch out); with none or both, a remote torch.Tensor comes back as
torch.Tensor when this kernel has torch (inside a dict or list too); --numpy / --torch force either.
"""

SESSION_EPILOG = """\
  While a session is active, cells run in it on its server (--url elsewhere is refused), and
  an interrupt raises KeyboardInterrupt in the cell's program: the session stays if it stops
  within 5 s. Names live in kcoral.session.namespace, which the session's client programs see.
"""

SETTINGS_NOTE = """\
Settings: %config KCoral.url / token / timeout / output_limit / quiet / require_gpu /
verbose_errors (True: whole tracebacks instead of two-line errors) / use_jobs (live output
through jobs where the server has them); KCORAL_URL, KCORAL_TOKEN. The embedded server:
KCoral.local_args (its kcoral server options) / local_start_timeout (seconds).
"""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Compact help: the usage line without ``usage:``, the description indented below it."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=26, width=94)

    def add_usage(
        self,
        usage: str | None,
        actions: Iterable[argparse.Action],
        groups: Iterable[argparse._MutuallyExclusiveGroup],
        prefix: str | None = None,
    ) -> None:
        super().add_usage(usage, actions, groups, prefix="")


class UsageParser(argparse.ArgumentParser):
    """A parser that never leaves the kernel: its errors are ``UsageError``s."""

    def __init__(
        self, prog: str, summary: str, *, epilog: str | None = None, usage: str | None = None
    ) -> None:
        super().__init__(
            prog=prog,
            usage=usage,
            description="\n".join("    " + line for line in summary.splitlines()),
            epilog=epilog,
            add_help=False,
            allow_abbrev=False,
            formatter_class=_HelpFormatter,
        )
        # Untitled: the options are listed under their command, with no "options:" heading.
        self.options = self.add_argument_group()

    def error(self, message: str) -> NoReturn:  # never sys.exit inside a kernel
        raise UsageError(f"{self.prog}: {message} (%kcoral --help lists the options)")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise UsageError(message or self.prog)

    def format_help(self) -> str:
        """One block per command: usage, summary and options without blank lines between
        them; the epilog (notes) after a blank line."""
        blocks = super().format_help().rstrip("\n").split("\n\n")
        notes = len(self.epilog.rstrip("\n").split("\n\n")) if self.epilog else 0
        head, tail = blocks[: len(blocks) - notes], blocks[len(blocks) - notes :]
        return "\n".join(head) + "".join("\n\n" + block for block in tail) + "\n"

    def usage_line(self) -> str:
        """The command and its arguments, as its help's first line shows them."""
        return self.format_usage().strip()

    def parse(self, words: Sequence[str]) -> argparse.Namespace:
        return self.parse_args(list(words))


def cell_parser() -> UsageParser:
    """``%%kcoral [options]``."""
    parser = UsageParser(
        "%%kcoral",
        "run the cell on a KCoral server",
        usage="%(prog)s [options]",
        epilog=CELL_EPILOG,
    )
    add = parser.options.add_argument
    add(
        "-i",
        "--in",
        dest="inputs",
        action="append",
        default=[],
        metavar="a,b",
        help="send kernel variables (tensors as tensors, bytes as bytes, JSON values as "
        'literals, anything else pickled); "-i a, b" works too',
    )
    add(
        "-o",
        "--out",
        dest="outputs",
        action="append",
        default=[],
        metavar="c,d",
        help="bring remote variables back into the kernel",
    )
    add(
        "--gpus",
        type=int,
        default=None,  # None: not given (runs with 1)
        metavar="N",
        help="GPUs for the cell (default 1; on a CPU server an explicit --gpus runs on CPU "
        "and says so in warning style)",
    )
    add(
        "--require-gpu",
        action="store_true",
        help="refuse to run on a server without a GPU (KCoral.require_gpu)",
    )
    add("--select", type=selector_text, metavar="SELECTOR", help=SELECT_HELP)
    add("--numpy", action="store_true", help="give every tensor back as NumPy arrays")
    add("--torch", action="store_true", help="give every tensor back as torch tensors")
    add(
        "--url",
        metavar="URL",
        help="this cell's server (127.0.0.1:8123 means http://127.0.0.1:8123)",
    )
    add("--timeout", type=float, metavar="S", help="execution deadline in seconds (KCoral.timeout)")
    add(
        "--output-limit",
        type=int,
        metavar="B",
        help="bytes of stdout/stderr kept per stream (KCoral.output_limit)",
    )
    add(
        "--file",
        dest="files",
        action="append",
        default=[],
        metavar="LOCAL[:REMOTE]",
        help="send a file",
    )
    add(
        "--folder",
        dest="folders",
        action="append",
        default=[],
        metavar="LOCAL[:REMOTE]",
        help="send a folder",
    )
    add(
        "--return-file",
        dest="return_files",
        action="append",
        default=[],
        metavar="PATH",
        help="bring a file the cell wrote back",
    )
    add(
        "--return-folder",
        dest="return_folders",
        action="append",
        default=[],
        metavar="PATH",
        help="bring a folder the cell wrote back",
    )
    add(
        "--noblock",
        action="store_true",
        help="submit as a job and return at once (%%kcoral attach ID follows it)",
    )
    add("-r", dest="result_name", metavar="NAME", help="with --noblock: bind the job to NAME")
    add("--quiet", action="store_true", help="no status line")
    add(  # the history of benchmark results (EXTENSIONS §12.6)
        "--bench-label",
        metavar="NAME",
        help="keep benchmark results in the notebook's history under NAME",
    )
    return parser


def selector_text(text: str) -> str:
    """A ``--select`` value in its canonical form (``gpu=h100,pool=big``); argparse turns a
    malformed one into the command's usage error, before anything is sent."""
    try:
        return format_selector(parse_selector(text))
    except SelectorError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (a selector is key=value[,key=value])") from None


#: ``--select``'s help, for cells and sessions alike
SELECT_HELP = (
    "run on a node that fits key=value[,key=value] (gpu=h100, arch, gpus=N: at least N, "
    "node, or an operator's label), through a router"
)


#: How many jobs ``%kcoral jobs`` lists by default, the newest: the server's own default of
#: 1000 rows buried the one a user looks for (its note says how many it left out).
JOBS_LISTED = 20
#: The most ``GET /v1/jobs?limit=N`` answers (EXTENSIONS §5).
MOST_JOBS_LISTED = 10000


def _job_count(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        count = 0
    if not 1 <= count <= MOST_JOBS_LISTED:
        raise argparse.ArgumentTypeError(f"N is a whole number from 1 to {MOST_JOBS_LISTED}")
    return count


def _positive_lines(text: str) -> int:
    try:
        lines = int(text)
    except ValueError:
        lines = 0
    if lines < 1:
        raise argparse.ArgumentTypeError("LINES is a positive whole number")
    return lines


_DEFAULT_SERVER = "the server to ask (default: the one cells run against)"
_JOB_ID = "a job of this kernel or of %%kcoral jobs"


def _line(words: str, summary: str, *, epilog: str | None = None) -> UsageParser:
    return UsageParser(f"%kcoral {words}", summary, epilog=epilog)


def line_parsers() -> dict[str, UsageParser]:
    """Every ``%kcoral`` command by its words (``"session start"``), in the help's order."""
    status = _line("status", "the server's health, info and these settings")
    status.options.add_argument("url", nargs="?", metavar="URL", help=_DEFAULT_SERVER)
    jobs = _line("jobs", "this server's recent jobs, the newest first")
    jobs.options.add_argument(
        "--limit",
        type=_job_count,
        default=JOBS_LISTED,
        metavar="N",
        help=f"list at most N jobs (default {JOBS_LISTED}, at most {MOST_JOBS_LISTED})",
    )
    jobs.options.add_argument("url", nargs="?", metavar="URL", help=_DEFAULT_SERVER)
    attach = _line("attach", "follow a job and bind its -o values")
    attach.options.add_argument("job_id", metavar="JOB_ID", help=_JOB_ID)
    cancel = _line("cancel", "cancel a job")
    cancel.options.add_argument("job_id", metavar="JOB_ID", help=_JOB_ID)
    connect = _line("connect", "run cells on URL (a failed connect leaves the kernel unconnected)")
    connect.options.add_argument("url", metavar="URL", help="host:port or http(s)://host:port")
    local_start = _line(
        "local start",
        "the embedded server (Linux only; started by the first cell when no server is configured)",
    )
    local_stop = _line("local stop", "stop the embedded server")
    local_log = _line(
        "local log",
        "the end of the embedded server's log, which goes to its log file only, never to\n"
        "the notebook or the terminal",
    )
    local_log.options.add_argument(
        "lines", nargs="?", type=_positive_lines, default=40, metavar="LINES", help="default 40"
    )
    url = _line("url", "the URL cells run against")
    client = UsageParser(
        "%kcoral client",
        "client = %kcoral client: a kcoral.Client for the kernel's server, with its token (it\n"
        "follows %kcoral connect and %kcoral local stop/start; the token is never shown)",
    )
    session_start = _line(
        "session start",
        "start a session on the kernel's server: from then on %%kcoral cells run in it, so\n"
        "the names a cell defines are there in the next (-i/-o still move values)",
    )
    add = session_start.options.add_argument
    add("--gpus", type=int, default=None, metavar="N", help="GPUs pinned to the session")
    add(
        "--idle",
        type=float,
        default=None,  # None: the server's --session-idle-seconds
        metavar="SECONDS",
        help="ended by the server after SECONDS without a cell (default: its own limit)",
    )
    add(
        "--keep",
        action="store_true",
        help="not ended by the kernel's shutdown or restart (which end it otherwise)",
    )
    add("--select", type=selector_text, metavar="SELECTOR", help=SELECT_HELP)
    session_stop = _line(
        "session stop", "end it (its state is gone); cells run without a session again"
    )
    session_status = _line("session status", "its state, programs, idle deadline and GPU")
    session_attach = _line(
        "session attach",
        "run cells in a session of yours from another kernel (started with --keep); it\n"
        "stays kept when this kernel ends",
    )
    session_attach.options.add_argument(
        "session_id", metavar="SESSION_ID", help="%%kcoral session list shows yours"
    )
    session_list = _line(
        "session list", "your sessions on the kernel's server", epilog=SESSION_EPILOG
    )
    version = _line("version", "client and server versions")
    help_ = UsageParser("%kcoral --help", "this text", epilog=SETTINGS_NOTE)
    return {
        "status": status,
        "jobs": jobs,
        "attach": attach,
        "cancel": cancel,
        "connect": connect,
        "local start": local_start,
        "local stop": local_stop,
        "local log": local_log,
        "url": url,
        "client": client,
        "session start": session_start,
        "session stop": session_stop,
        "session status": session_status,
        "session attach": session_attach,
        "session list": session_list,
        "version": version,
        "--help": help_,
    }


def group_usage(group: str, parsers: dict[str, UsageParser]) -> str:
    """A command group's usage (``%kcoral session start ... | stop | ...``), from its parsers."""
    prefix = f"%kcoral {group} "
    forms = [
        parser.usage_line().removeprefix(prefix)
        for words, parser in parsers.items()
        if words.startswith(group + " ")
    ]
    return f"{prefix}{' | '.join(forms)} (%kcoral --help)"


def asks_for_help(words: Sequence[str]) -> bool:
    """Whether a command's words ask for its help (``--help`` or ``-h`` anywhere): a user
    types ``%kcoral jobs --help`` as in a shell, which was refused as an unknown option."""
    return any(word in ("--help", "-h") for word in words)


def help_text() -> str:
    """``%kcoral --help``: every command's help, rendered from its parser."""
    parsers = [cell_parser(), *line_parsers().values()]
    return "\n".join(parser.format_help() for parser in parsers)


def split_words(line: str, magic: str) -> list[str]:
    """The words of a magic's line, split as a shell splits them. The line is the user's own
    typing: an unclosed quote or a trailing backslash is a one-line ``UsageError`` naming
    the line, never shlex's ``ValueError`` traceback."""
    try:
        return shlex.split(line)
    except ValueError as exc:
        what = (
            "a quote is not closed"
            if "quotation" in str(exc)
            else "the line ends in a backslash that escapes nothing"
        )
        shown = " ".join(line.split())[:120]
        raise UsageError(f"{magic}: {what} in {shown!r} (close it, or leave it out)") from None


def join_name_lists(words: list[str]) -> list[str]:
    """Rejoin a name list that the shell split at its spaces: ``-i a, b`` -> ``-i a,b``."""
    joined: list[str] = []
    for word in words:
        if (
            len(joined) >= 2
            and joined[-2] in _LIST_OPTIONS
            and (joined[-1].endswith(",") or word.startswith(","))
        ):
            joined[-1] += word
            continue
        joined.append(word)
    return joined


def names(text: str) -> list[str]:
    """The Python names of one ``-i``/``-o`` value (``"a, b"``)."""
    found = [part.strip() for part in text.split(",") if part.strip()]
    for name in found:
        if not name.isidentifier():
            raise UsageError(f"%%kcoral: {name!r} is not a Python name")
    return found


#: ``%kcoral --help``, rendered from the parsers above (``%kcoral?`` shows it too).
HELP = help_text()
