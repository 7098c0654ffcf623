"""Secrets typed on the command line (SERVER §2, ROUTER §11).

Who can reach what: a process's command line is readable by every local user (``ps``,
``/proc/PID/cmdline``) for as long as the process runs, so a token given as
``--node-token`` or ``--metrics-token`` is given to all of them: another user on a shared
GPU box could then serve as a node of the router, or read its metrics. The flags stay (a
test or a one-user machine may want them); a start with one says so once, naming the
environment variable that keeps the token out of sight.
"""

from __future__ import annotations

from collections.abc import Sequence

#: Each flag that takes a secret, and the environment variable that takes it instead.
SECRET_FLAGS = {"--node-token": "KCORAL_NODE_TOKEN", "--metrics-token": "KCORAL_METRICS_TOKEN"}


def secret_flag_warnings(program: str, argv: Sequence[str]) -> list[str]:
    """One warning line per secret flag in ``argv`` (``--flag VALUE`` or ``--flag=VALUE``),
    for ``program``'s stderr; none after a ``--``."""
    given: list[str] = []
    for argument in argv:
        if argument == "--":
            break
        flag = argument.split("=", 1)[0]
        if flag in SECRET_FLAGS and flag not in given:
            given.append(flag)
    return [
        f"{program}: warning: {flag} on the command line can be read by every local user "
        f"(ps) while {program} runs; give it in {SECRET_FLAGS[flag]} instead"
        for flag in given
    ]
