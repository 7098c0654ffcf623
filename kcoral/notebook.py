"""Where the client's objects meet notebook rendering: the one wiring of ``_repr_html_``.

``ProgramResult``, ``ReturnedFile``, ``ReturnedFolder``, ``Job`` and the benchmark results
render through their ``_repr_html_``, which calls ``html_of``; the markup itself lives in
the Jupyter package (``kcoral_jupyter.display``, ``kcoral_jupyter.bench_display``),
imported here on first display, never when ``kcoral`` is imported. Without the Jupyter
package the objects show as text.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

#: The class name of each rendered object -> its function in ``kcoral_jupyter.display``
#: (``module:function`` for another module of ``kcoral_jupyter``).
RENDERERS = {
    "ProgramResult": "program_result_html",
    "ReturnedFile": "returned_file_html",
    "ReturnedFolder": "returned_folder_html",
    "Job": "job_html",
    "BenchmarkResult": "bench_display:bench_result_html",
    "ComparisonResult": "bench_display:bench_result_html",
}


def html_of(value: Any) -> str | None:
    """``value``'s notebook HTML, or ``None`` (plain text) without the Jupyter package."""
    module, _, function = RENDERERS[type(value).__name__].rpartition(":")
    try:
        display = importlib.import_module(f"kcoral_jupyter.{module or 'display'}")
    except ImportError:
        return None
    render: Callable[[Any], str | None] = getattr(display, function)
    return render(value)
