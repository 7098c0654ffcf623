"""How the front-end learns that a worker's process is gone (``WorkerHandle.wait_exit``),
including for a worker whose launch was cancelled once its fork was under way (shutdown
cancels a worker forked ahead): nothing watches that one's exit, so it is polled."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

from kcoral_server.processes.handle import WorkerHandle


def _handle() -> WorkerHandle:
    return WorkerHandle(
        seat_id="s0", generation=1, device="cpu", gpu_ids=[], gpu_uuids=[], arbiter=None
    )


def test_a_worker_whose_launch_was_cancelled_is_seen_to_exit_by_polling() -> None:
    async def main() -> None:
        handle = _handle()
        # as a cancelled launch leaves it: started, but no exit watch was ever started on it
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        handle.os_process.process = process
        try:
            assert await handle.wait_exit(0.1) is False  # still running
            process.send_signal(signal.SIGKILL)
            # no timeout: without the polling this would wait for an event nobody sets
            assert await asyncio.wait_for(handle.wait_exit(None), 30) is True
            assert process.returncode == -signal.SIGKILL
        finally:
            process.kill()
            process.wait()

    asyncio.run(main())
