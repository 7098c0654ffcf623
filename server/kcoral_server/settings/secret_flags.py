"""Secrets given where they are exposed or not read (SERVER §2, §13, ROUTER §10, §11).

Who can reach what: a process's command line is readable by every local user (``ps``,
``/proc/PID/cmdline``) for as long as the process runs, so a token given as
``--node-token`` or ``--metrics-token`` is given to all of them: another user on a shared
GPU box could then serve as a node of the router, or read its metrics. The flags stay (a
test or a one-user machine may want them); a start with one says so once, naming the
environment variable that keeps the token out of sight.

A token in ``KCORAL_TOKEN`` (the clients' variable) is not read by a server or a router,
whose own is ``KCORAL_AUTH_TOKEN``: ``KCORAL_TOKEN=s3cret kcoral server`` started a server
that required no token at all, its user believing otherwise (``client_variable_hint``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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


#: what a server or router says instead of its loopback "no client token" line when the
#: clients' variable holds a token it does not read (at most the console's 120 characters)
CLIENT_VARIABLE_HINT = (
    "KCORAL_TOKEN is set but only clients read it: no token is required; give it as "
    "KCORAL_AUTH_TOKEN or --auth-token-file"
)


def client_variable_hint(environ: Mapping[str, str]) -> str | None:
    """``CLIENT_VARIABLE_HINT`` when ``KCORAL_TOKEN`` holds a token, else None."""
    return CLIENT_VARIABLE_HINT if environ.get("KCORAL_TOKEN", "").strip() else None
