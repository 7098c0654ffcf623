"""Run one function of an uploaded module on a real server, as the benchmark tests do."""

from __future__ import annotations

from typing import Any

from kcoral import Client, Program
from kcoral.results import ProgramResult


def call_on_server(url: str, source: str, name: str, timeout: float) -> ProgramResult:
    """Upload ``source``, call its function ``name`` without arguments, return it as
    ``value``: the program's result."""
    program = Program()
    module = program.upload(kind="module", source=source, id="m")
    fn = program.get_function(module=module, name=name, id="f")
    program.return_(key="value", value=program.run(fn=fn, id="out"))
    with Client(url) as client:
        return client.execute(program, timeout_seconds=timeout)


def value_returned(url: str, source: str, name: str, timeout: float = 300) -> Any:
    """``call_on_server``'s returned value, the program checked completed first."""
    result = call_on_server(url, source, name, timeout)
    assert result.completed, result.error
    return result["value"]
