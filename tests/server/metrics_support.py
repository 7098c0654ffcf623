"""Reading a server's ``/metrics`` text in tests: sample lines -> values."""

from __future__ import annotations

import re
from pathlib import Path

from http_helpers import get
from server_process import RunningServer, start_server

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)")


def scrape(url: str, headers: dict[str, str] | None = None) -> dict[str, float]:
    """``name{labels}`` -> value of every sample ``GET /metrics`` returns."""
    response = get(url, "/metrics", headers)
    assert response.status == 200, response.raw[:300]
    samples: dict[str, float] = {}
    for line in response.raw.decode().splitlines():
        match = _SAMPLE.match(line)
        if match and not line.startswith("#"):
            samples[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return samples


def metric_names(url: str, headers: dict[str, str] | None = None) -> set[str]:
    """The metric names (samples' names, without labels) of ``/metrics``."""
    return {key.split("{", 1)[0] for key in scrape(url, headers)}


def exported_names(url: str, headers: dict[str, str] | None = None) -> set[str]:
    """Every sample name ``/metrics`` can hold, from its ``# TYPE`` lines (a histogram
    without observations yet still names its ``_bucket``, ``_count`` and ``_sum``)."""
    response = get(url, "/metrics", headers)
    assert response.status == 200
    names: set[str] = set()
    for line in response.raw.decode().splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            suffixes = ("_bucket", "_count", "_sum") if kind == "histogram" else ("",)
            names.update(name + suffix for suffix in suffixes)
    return names


def start_server_with_a_metrics_token(
    directory: Path, client_token: str, metrics_token: str
) -> RunningServer:
    """A real one-worker server checking ``client_token``, with ``metrics_token`` as its
    ``--metrics-token`` (given by env, as the docs advise)."""
    token_file = directory / "tokens"
    token_file.write_text(client_token + "\n")
    token_file.chmod(0o600)
    return start_server(
        directory,
        ["--num-workers", "1", "--auth-token-file", str(token_file)],
        env={"KCORAL_METRICS_TOKEN": metrics_token},
    )
