"""A request's program once every check of PROTOCOL §3.2 passed: what its run needs, as one
record that travels from the pipeline to the seat's run and its worker (SERVER §5–§8)."""

from __future__ import annotations

from dataclasses import dataclass

from kcoral.protocol.request import ParsedRequest
from kcoral.protocol.schema import Program
from kcoral_server.execution.blob_resolution import Resolution
from kcoral_server.settings.config import ServerConfig

__all__ = ["AdmittedProgram"]


@dataclass(frozen=True)
class AdmittedProgram:
    """The parsed request, its resolved blobs, and the deadline and output limit it runs
    under (the program's own, within the server's maximums)."""

    parsed: ParsedRequest
    resolution: Resolution  # every blob the program uses is present
    timeout: float  # seconds (PROTOCOL §4.1, SERVER §8); lease waits pause it
    output_limit: int  # bytes each captured stream keeps (SERVER §9); 0: no capture

    @classmethod
    def under(
        cls, parsed: ParsedRequest, resolution: Resolution, config: ServerConfig
    ) -> AdmittedProgram:
        """``parsed`` with the deadline and output limit ``config`` allows it."""
        options = parsed.program.options
        timeout = config.default_timeout_seconds
        if options.timeout_seconds is not None:
            timeout = options.timeout_seconds
        limit = config.output_limit_bytes
        if options.output_limit_bytes is not None:
            limit = options.output_limit_bytes
        return cls(
            parsed=parsed,
            resolution=resolution,
            timeout=min(float(timeout), float(config.max_timeout_seconds)),
            output_limit=min(int(limit), int(config.max_output_limit_bytes)),
        )

    @property
    def program(self) -> Program:
        return self.parsed.program
