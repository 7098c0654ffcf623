"""A GPU's busy time while a program runs (EXTENSIONS §13): ``kcoral_gpu_busy{gpu}`` is 1 and
``kcoral_gpu_busy_seconds_total{gpu}`` grows while a program holds the GPU's lease, not only
when it ends. Before, the lease-held histogram was the only GPU-time series, observed when a
program finished: a dashboard's GPU use stayed 0 for the whole of a long program (a 2-hour
training run) and then jumped, and one past 600 s fell in no bucket but +Inf."""

from __future__ import annotations

import threading
from pathlib import Path

from http_helpers import execute
from metrics_support import scrape
from raw_http import call_program
from server_process import start_server

WAITS_FOR_A_FILE = """
import os, time

def main(path):
    while not os.path.exists(path):
        time.sleep(0.05)
    return 1
"""
FAKE_GPU = ["--device", "fake-gpu", "--fake-gpu-count", "1", "--workers-per-gpu", "1"]
BUSY, BUSY_SECONDS = 'kcoral_gpu_busy{gpu="0"}', 'kcoral_gpu_busy_seconds_total{gpu="0"}'
#: scrapes to wait for a state (each answers at once; a bound, not a measurement)
PATIENCE = 600


def scrape_until(url: str, wanted) -> dict[str, float]:
    for _ in range(PATIENCE):
        samples = scrape(url)
        if wanted(samples):
            return samples
        threading.Event().wait(0.05)
    raise AssertionError(f"never reached: {samples}")


def test_a_gpu_reads_busy_and_its_busy_seconds_grow_while_a_program_runs(tmp_path: Path) -> None:
    server = start_server(tmp_path / "server", FAKE_GPU)
    release = tmp_path / "release"
    try:
        # a worker's start-up holds the lease too (CUDA initialization), briefly
        idle = scrape_until(server.url, lambda s: s.get(BUSY) == 0)
        assert idle[BUSY_SECONDS] >= 0, idle
        answers: list[int] = []
        program = call_program(WAITS_FOR_A_FILE, args=[str(release)])
        runner = threading.Thread(
            target=lambda: answers.append(execute(server.url, program).status)
        )
        runner.start()
        try:
            running = scrape_until(server.url, lambda s: s.get(BUSY) == 1)
            later = scrape_until(server.url, lambda s: s[BUSY_SECONDS] > running[BUSY_SECONDS])
            assert later[BUSY] == 1  # still the same program: it has not ended
        finally:
            release.write_text("go")
            runner.join()
        assert answers == [200]
        done = scrape_until(server.url, lambda s: s.get(BUSY) == 0)
        assert done[BUSY_SECONDS] >= later[BUSY_SECONDS]  # the ended tenure stays counted
    finally:
        server.stop()


def test_a_cpu_server_exports_no_gpu_busy_series(tmp_path: Path) -> None:
    server = start_server(tmp_path / "server", ["--num-workers", "1"])
    try:
        names = {key.split("{", 1)[0] for key in scrape(server.url)}
        assert not {"kcoral_gpu_busy", "kcoral_gpu_busy_seconds_total"} & names
    finally:
        server.stop()
