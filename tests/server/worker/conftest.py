"""Fixtures starting real worker processes (see worker_harness.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from worker_harness import Worker, launch


@pytest.fixture
def start_worker(tmp_path: Path):
    """Factory: ``start_worker(device="cpu", **options)`` -> a started ``Worker``."""
    started: list[Worker] = []

    def start(device: str = "cpu", **options: Any) -> Worker:
        directory = tmp_path / f"worker{len(started)}"
        directory.mkdir()
        worker = launch(directory, device, **options)
        started.append(worker)
        assert worker.ready is not None, worker.failed
        return worker

    yield start
    for worker in started:
        worker.kill()


@pytest.fixture(scope="module")
def shared_worker(tmp_path_factory: pytest.TempPathFactory):
    """One reused CPU worker for tests that only look at instruction results."""
    worker = launch(tmp_path_factory.mktemp("shared-worker"))
    assert worker.ready is not None, worker.failed
    yield worker
    worker.kill()
