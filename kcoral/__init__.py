"""KCoral: run GPU work from a notebook or script on a remote GPU server.

Names are resolved on first use so that ``import kcoral`` stays thin: it imports no server,
torch, Jupyter or gRPC module (a test checks this in a fresh interpreter).
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("kcoral")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "Client": "kcoral.client",
    "AsyncClient": "kcoral.async_client",
    "Program": "kcoral.program",
    "Register": "kcoral.program",
    "ProgramResult": "kcoral.results",
    "ReturnedFile": "kcoral.results",
    "ReturnedFolder": "kcoral.results",
    "BenchmarkResult": "kcoral.bench.results",
    "ComparisonResult": "kcoral.bench.results",
    "format_comparison": "kcoral.bench.results",
    "RemoteFunction": "kcoral.remote",
    "Job": "kcoral.jobs",
    "KCoralError": "kcoral.errors",
    "TransportError": "kcoral.errors",
    "ProtocolError": "kcoral.errors",
    "RemoteExecutionError": "kcoral.errors",
    "ServerConfig": "kcoral_server.settings.config",
    "parse_program": "kcoral.protocol.validate",
    "create_app": "kcoral_server.front_door.app",
}

__all__ = [*sorted(_EXPORTS), "__version__"]
#: submodules a program names through the package alone: ``kcoral.session.namespace`` is
#: where a session's state lives (README "Sessions"), written after a bare ``import kcoral``
_SUBMODULES = frozenset({"session"})


if not TYPE_CHECKING:  # type checkers see the imports at the end, and no fallback for typos

    def __getattr__(name: str) -> Any:
        if name in _SUBMODULES:  # ``import kcoral`` then ``kcoral.session.namespace``
            return importlib.import_module(f"kcoral.{name}")
        module_name = _EXPORTS.get(name)
        if module_name is None:
            raise AttributeError(f"module 'kcoral' has no attribute {name!r}")
        value = getattr(importlib.import_module(module_name), name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | _SUBMODULES)


def load_ipython_extension(ipython: InteractiveShell) -> None:
    """``%load_ext kcoral`` loads the Jupyter integration."""
    from kcoral_jupyter import load_ipython_extension as load

    load(ipython)


if TYPE_CHECKING:  # static analysers see the real names ("X as X": re-exported, PEP 484)
    from IPython.core.interactiveshell import InteractiveShell
    from kcoral_server.front_door.app import create_app as create_app
    from kcoral_server.settings.config import ServerConfig as ServerConfig

    from kcoral import session as session
    from kcoral.async_client import AsyncClient as AsyncClient
    from kcoral.bench.results import BenchmarkResult as BenchmarkResult
    from kcoral.bench.results import ComparisonResult as ComparisonResult
    from kcoral.bench.results import format_comparison as format_comparison
    from kcoral.client import Client as Client
    from kcoral.errors import KCoralError as KCoralError
    from kcoral.errors import ProtocolError as ProtocolError
    from kcoral.errors import RemoteExecutionError as RemoteExecutionError
    from kcoral.errors import TransportError as TransportError
    from kcoral.jobs import Job as Job
    from kcoral.program import Program as Program
    from kcoral.program import Register as Register
    from kcoral.protocol.validate import parse_program as parse_program
    from kcoral.remote import RemoteFunction as RemoteFunction
    from kcoral.results import ProgramResult as ProgramResult
    from kcoral.results import ReturnedFile as ReturnedFile
    from kcoral.results import ReturnedFolder as ReturnedFolder
