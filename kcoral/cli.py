"""The ``kcoral`` command: ``kcoral server``, ``kcoral router`` and ``kcoral run``.

Sub-commands import their implementation only when chosen, so ``kcoral run`` never loads the
server stack.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

_USAGE = """\
usage: kcoral {server,router,run} ...

KCoral: run GPU work on a remote GPU server.

sub-commands:
  server    run a KCoral server (see `kcoral server --help`)
  router    run a router in front of many GPU nodes (see `kcoral router --help`)
  run       run a tool (python, shell, ncu, ...) on a remote worker (see `kcoral run --help`)
"""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        sys.stdout.write(_USAGE)
        return 0
    if not args:
        # a script whose sub-command came from an empty variable must not pass for a success
        sys.stderr.write(f"kcoral: missing sub-command\n\n{_USAGE}")
        return 2
    command, rest = args[0], args[1:]
    if command == "server":
        return server_main(rest)
    try:
        return _sub_command(command, rest)
    except KeyboardInterrupt:  # Ctrl-C while Python still imports the sub-command
        return _interrupted()


def _sub_command(command: str, rest: list[str]) -> int:
    if command == "router":
        try:
            from kcoral_server.router.main import main as router_main
        except ImportError as exc:
            return _missing_extra("router", exc)
        return router_main(rest)
    if command == "run":
        from kcoral.run.command import main as run_main

        return run_main(rest)
    sys.stderr.write(f"kcoral: unknown sub-command {command!r}\n\n{_USAGE}")
    return 2


def server_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``kcoral server`` and ``kcoral-server``."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        try:
            from kcoral_server.main import main as run_server
        except ImportError as exc:
            return _missing_extra("server", exc)
        return run_server(args)
    except KeyboardInterrupt:  # before the server's own signal handlers are in place
        return _interrupted()


def _interrupted() -> int:
    """Ctrl-C before a sub-command handles it itself: one line, not Python's traceback."""
    sys.stderr.write("kcoral: interrupted\n")
    return 130


def _missing_extra(extra: str, exc: ImportError) -> int:
    """``kcoral server`` or ``kcoral router`` (``--help`` too, which lists flags the missing
    module defines) without its extra: what to install, for that command."""
    sys.stderr.write(
        f"kcoral {extra}: missing dependency ({exc.name or exc}); "
        f"install it with: pip install 'kcoral[{extra}]'\n"
    )
    return 1
