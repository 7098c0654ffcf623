"""What an executed notebook cell (nbclient) shows, for the real-kernel tests of
tests/jupyter."""

from __future__ import annotations

from typing import Any


def shown(cell: Any, *, tracebacks: bool = True) -> str:
    """The cell's streams and plain-text results, one output a line, and its error
    tracebacks unless ``tracebacks`` is False."""
    parts = []
    for output in cell.outputs:
        if output.output_type == "stream":
            parts.append(output.text)
        elif "data" in output:
            parts.append(output["data"].get("text/plain", ""))
        elif tracebacks and output.output_type == "error":
            parts.append("\n".join(output["traceback"]))
    return "\n".join(parts)
