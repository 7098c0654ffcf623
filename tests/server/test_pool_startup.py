"""What a pool learns from its first workers (server/kcoral_server/pool/startup.py, SERVER.md
§4)."""

from __future__ import annotations

import pytest
from kcoral_server.pool.seat import Seat
from kcoral_server.pool.startup import PoolStartError, common_target
from kcoral_server.processes.start import WorkerInfo


class Started:
    def __init__(self, arch: str) -> None:
        self.info = WorkerInfo(1, {"arch": arch}, {"python": "3"})


def started_seat(arch: str) -> Seat:
    return Seat("gpu0/w0", 0, worker=Started(arch))  # type: ignore[arg-type]


def test_the_server_reports_the_target_and_versions_of_its_first_worker() -> None:
    target, versions = common_target([started_seat("sm_90a"), started_seat("sm_90a")])
    assert target == {"arch": "sm_90a"} and versions == {"python": "3"}


def test_a_pool_without_a_started_worker_or_with_mixed_architectures_does_not_start() -> None:
    with pytest.raises(PoolStartError, match="no worker"):
        common_target([])
    with pytest.raises(PoolStartError, match="different architectures"):
        common_target([started_seat("sm_90a"), started_seat("sm_80")])
