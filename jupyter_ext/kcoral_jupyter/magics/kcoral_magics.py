"""The one IPython magic, ``%%kcoral`` / ``%kcoral``: each command to its family.

``%%kcoral`` runs the cell (``cell.py``); ``%kcoral WORDS`` is looked up by its first one or
two words among the parsers of ``options.line_parsers`` and handed, parsed, to the family
that does it (``jobs.py``, ``server.py``, ``sessions.py``). Request-level failures leave as
two-line errors (``cell_errors``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, line_cell_magic, magics_class

from kcoral import KCoralError, TransportError
from kcoral_jupyter.cell_errors import TwoLineError, shorten
from kcoral_jupyter.kernel_state import KernelState
from kcoral_jupyter.magics.cell import CellMagic
from kcoral_jupyter.magics.jobs import JobCommands
from kcoral_jupyter.magics.options import (
    HELP,
    UsageParser,
    asks_for_help,
    cell_parser,
    group_usage,
    line_parsers,
    split_words,
)
from kcoral_jupyter.magics.server import ServerCommands
from kcoral_jupyter.magics.sessions import SessionCommands

Handler = Callable[[argparse.Namespace], Any]


@magics_class
class KCoralMagics(Magics):
    def __init__(self, shell: InteractiveShell, kernel: KernelState) -> None:
        super().__init__(shell)
        self.kernel = kernel
        self.cell = CellMagic(shell, kernel)
        jobs = JobCommands(kernel, self.cell)
        server = ServerCommands(kernel)
        sessions = SessionCommands(kernel)
        self.parsers = line_parsers()
        handlers: dict[str, Handler] = {
            "status": jobs.status,
            "jobs": jobs.jobs,
            "attach": jobs.attach,
            "cancel": jobs.cancel,
            "connect": server.connect,
            "local start": server.local_start,
            "local stop": server.local_stop,
            "local log": server.local_log,
            "url": server.url,
            "client": server.client,
            "session start": sessions.start,
            "session stop": sessions.stop,
            "session status": sessions.status,
            "session attach": sessions.attach,
            "session list": sessions.list_sessions,
            "version": server.version,
            "--help": self._help,
        }
        if set(handlers) != set(self.parsers):  # one table of commands, one of parsers
            raise RuntimeError("every %kcoral command needs a parser and a handler")
        self.handlers = handlers
        self.aliases = {"-h": "--help", "help": "--help", "--version": "version"}

    @line_cell_magic
    def kcoral(self, line: str, cell: str | None = None) -> Any:
        try:
            if cell is None:
                return self._line(line)
            if asks_for_help(split_words(line, "%%kcoral")):  # the cell is not run
                print(cell_parser().format_help(), end="")
                return None
            return self.cell.run(line, cell)
        except (TransportError, KCoralError) as exc:
            # Not a program's failure: the transport's chain of causes and our frames help
            # nobody at the notebook; two lines do (the chain stays on __cause__).
            short = shorten(exc)
            self._mark(short)
            raise short from exc
        except TwoLineError as exc:
            self._mark(exc)
            raise

    def _mark(self, error: BaseException) -> None:
        """Render a two-line error in full when ``KCoral.verbose_errors`` asks for it."""
        if isinstance(error, TwoLineError):
            error.verbose = self.kernel.settings.verbose_errors

    def _line(self, line: str) -> Any:
        words = split_words(line, "%kcoral")
        if not words:
            raise UsageError(
                "%kcoral: use %%kcoral as a cell magic, or %kcoral status | jobs | attach ID | "
                "cancel ID | connect URL | local start|stop|log | session ... | url | client | "
                "version (%kcoral --help)"
            )
        first = self.aliases.get(words[0], words[0])
        for command, rest in ((" ".join([first, *words[1:2]]), words[2:]), (first, words[1:])):
            if command in self.handlers:
                parser: UsageParser = self.parsers[command]
                if asks_for_help(rest):
                    print(parser.format_help(), end="")
                    return None
                return self.handlers[command](parser.parse(rest))
        group = [p for words, p in self.parsers.items() if words.startswith(first + " ")]
        if group and asks_for_help(words[1:]):  # %kcoral session --help: each command's
            print("\n".join(parser.format_help() for parser in group), end="")
            return None
        if group:
            raise UsageError(group_usage(first, self.parsers))
        raise UsageError(f"%kcoral: unknown command {first!r} (%kcoral --help lists them)")

    def _help(self, args: argparse.Namespace) -> None:
        print(HELP, end="")


KCoralMagics.kcoral.__doc__ = HELP  # %kcoral? shows the same text as %kcoral --help
