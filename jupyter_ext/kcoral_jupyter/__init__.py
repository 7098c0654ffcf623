"""Jupyter integration for KCoral (IPython magics, rich display, server extension).

``%load_ext kcoral`` (or ``kcoral_jupyter``) adds ``%%kcoral``/``%kcoral``; the Jupyter
server loads the REST extension through ``_jupyter_server_extension_points``. This module
only hands names on; nothing heavy is imported until one of these functions runs.
"""

from __future__ import annotations

from typing import Any


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics and the settings object (``%config KCoral``). No HTML formatter is
    registered: results and jobs render through their own ``_repr_html_``."""
    from kcoral_jupyter.extension import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from kcoral_jupyter.extension import unload

    unload(ipython)


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "kcoral_jupyter"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from kcoral_jupyter.server_extension import load_server_extension

    load_server_extension(serverapp)
