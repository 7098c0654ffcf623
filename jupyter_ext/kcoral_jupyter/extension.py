"""Loading and unloading the IPython extension in a kernel."""

from __future__ import annotations

from typing import Any

from kcoral_jupyter.kernel_state import Session
from kcoral_jupyter.magics import KCoralMagics
from kcoral_jupyter.settings import KCoral

# Rich display of results and jobs is wired once, by their ``_repr_html_`` (kcoral.notebook);
# no formatter is registered here.
_SESSIONS: dict[int, Session] = {}


def load(ipython: Any) -> None:
    if id(ipython) in _SESSIONS:  # %load_ext twice, or via both names
        return
    settings = KCoral(parent=ipython)
    ipython.configurables.append(settings)
    session = Session(settings=settings)
    _SESSIONS[id(ipython)] = session
    ipython.register_magics(KCoralMagics(ipython, session))
    ipython.events.register("pre_run_cell", _drop_stale_hook(ipython))


def _drop_stale_hook(ipython: Any) -> Any:
    def drop(*_: Any) -> None:
        # A provenance tag whose value was never displayed must not outlive its cell.
        ipython.displayhook.__dict__.pop("compute_format_data", None)

    return drop


def unload(ipython: Any) -> None:
    session = _SESSIONS.pop(id(ipython), None)
    if session is not None:
        session.close()
        if session.settings in ipython.configurables:
            ipython.configurables.remove(session.settings)


def session_of(ipython: Any) -> Session | None:
    """The extension's state in ``ipython`` (tests and advanced users)."""
    return _SESSIONS.get(id(ipython))
