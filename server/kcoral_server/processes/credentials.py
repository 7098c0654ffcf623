"""The operator's credentials in the server's environment, kept from programs on a server
several people reach (SERVER §14, EXTENSIONS §6).

Who can reach what: a program reads its worker's whole environment, and that environment is
the server's, less KCoral's own secrets and ``--worker-env-deny``. On a server one person
uses (one bare client token, none on loopback, or the notebook's own server) that person's
``HF_TOKEN`` or cloud keys are theirs to use. Where several people reach the server (a token
file that names two or more, no token off loopback, or a node behind a router, whose callers
are the router's), another token holder's program read the operator's
``AWS_SECRET_ACCESS_KEY``, ``HF_TOKEN`` and ``SSH_AUTH_SOCK`` (attack sweep). There, every
name that looks like a credential is withheld unless ``--worker-env-allow`` names it, and
the start-up log names what was withheld (never a value).

Decided at start: a token reload that turns one identity into several keeps the workers'
environment as it was until the server restarts (the launchers workers fork from hold it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kcoral_server.processes.sandbox import is_denied

#: parts of a name (any case) that mark a credential
CREDENTIAL_MARKERS = (
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "API_KEY",
    "APIKEY",
    "ACCESS_KEY",
    "PRIVATE_KEY",
    "CREDENTIAL",
)
#: whole names that hand a program someone's agent (a socket that signs as its owner)
CREDENTIAL_NAMES = frozenset({"SSH_AUTH_SOCK", "GPG_AGENT_INFO"})
#: words that hold a marker and name no credential: Hugging Face's
#: ``TOKENIZERS_PARALLELISM``, set on many GPU servers to quiet a warning in every forked
#: data loader, was withheld from every program
NOT_CREDENTIALS = ("TOKENIZER",)


def is_credential_variable(name: str) -> bool:
    """Whether the variable ``name`` looks like it holds a credential."""
    upper = name.upper()
    if upper in CREDENTIAL_NAMES:
        return True
    for word in NOT_CREDENTIALS:
        upper = upper.replace(word, "_")
    return any(marker in upper for marker in CREDENTIAL_MARKERS)


def withheld_credentials(
    environ: Mapping[str, str], identities: int | None, allow: Iterable[str] = ()
) -> list[str]:
    """The credential-looking names of ``environ`` no worker inherits, sorted: none where
    one identity reaches the server (``identities`` 1), else every such name that
    ``allow`` (``--worker-env-allow``) does not name. ``identities`` None: the server's
    callers are a router's, or anyone's (no token off loopback), several."""
    if identities is not None and identities < 2:
        return []
    allowed = list(allow)
    return sorted(
        name for name in environ if is_credential_variable(name) and not is_denied(name, allowed)
    )


def _listed(names: list[str]) -> str:
    """``names`` for a log line: the first 20, then how many more."""
    return ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")


def withheld_message(names: list[str]) -> str:
    """The start-up event's words: what no program gets, and how to pass one on."""
    return (
        f"several people reach this server: no program gets the server's {_listed(names)} "
        "(credentials); --worker-env-allow NAME passes one on"
    )


def credentials_kept(environ: Mapping[str, str], config: Any, identities: int | None) -> list[str]:
    """After a token reload to ``identities``: the credential-looking names workers still
    get although several identities reach the server now (withheld only from a restart on:
    the launchers workers fork from hold the environment of the start)."""
    if config.worker_env_withheld:
        return []
    return withheld_credentials(environ, identities, config.worker_env_allow)


def kept_message(names: list[str]) -> str:
    """The reload's warning: what programs still get until a restart."""
    return (
        f"several identities reach this server now, and programs still get the server's "
        f"{_listed(names)} (credentials) until it restarts; restart it to withhold them"
    )
