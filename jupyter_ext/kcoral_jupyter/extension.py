"""Loading and unloading the IPython extension in a kernel."""

from __future__ import annotations

from collections.abc import Callable

from IPython.core.interactiveshell import InteractiveShell

from kcoral_jupyter.kernel_state import KernelState
from kcoral_jupyter.magics.kcoral_magics import KCoralMagics
from kcoral_jupyter.settings import KCoral

# Rich display of results and jobs is wired once, by their ``_repr_html_`` (kcoral.notebook);
# no formatter is registered here.
_STATES: dict[int, KernelState] = {}


def load(ipython: InteractiveShell) -> None:
    if id(ipython) in _STATES:  # %load_ext twice, or via both names
        return
    settings = KCoral(parent=ipython)
    # IPython types configurables as its shells; any Configurable belongs there
    ipython.configurables.append(settings)  # type: ignore[arg-type]
    kernel = KernelState(settings=settings)
    _STATES[id(ipython)] = kernel
    ipython.register_magics(KCoralMagics(ipython, kernel))
    ipython.events.register("pre_run_cell", _drop_stale_hook(ipython))


def _drop_stale_hook(ipython: InteractiveShell) -> Callable[..., None]:
    def drop(*_: object) -> None:
        # A provenance tag whose value was never displayed must not outlive its cell.
        ipython.displayhook.__dict__.pop("compute_format_data", None)

    return drop


def unload(ipython: InteractiveShell) -> None:
    kernel = _STATES.pop(id(ipython), None)
    if kernel is not None:
        kernel.close()
        configurables: list[object] = list(ipython.configurables)
        if kernel.settings in configurables:
            ipython.configurables.remove(kernel.settings)  # type: ignore[arg-type]


def kernel_state_of(ipython: InteractiveShell) -> KernelState | None:
    """The extension's state in ``ipython`` (tests and advanced users)."""
    return _STATES.get(id(ipython))
