"""The Ray peer row of ``perf.py``: a trivial actor method call round trip.

    RAY_PYTHON benchmarks/perf_ray.py SAMPLES [WARM_SECONDS]

Runs in Ray's own interpreter (``benchmarks/.ray-venv``, made by ``setup_ray.sh``), never in
the project's: it imports nothing of KCoral, so Ray's pinned grpcio/protobuf stay out of the
router's environment. ``perf.py`` starts it as a subprocess and reads the one JSON line it
prints on stdout: ``{"ray": VERSION, "samples": [seconds, ...], "init_seconds": s}``.

The actor is created once and warmed (``WARM_UP_CALLS`` calls and at least WARM_SECONDS of
them: ``perf.py`` passes the time its KCoral series warm the machine for,
``perf_kcoral.MACHINE_WARM_SECONDS``); each sample is one ``ray.get(actor.f.remote())`` —
the same shape as a KCoral trivial request on a reused worker (a call into a long-lived
process that returns a small value). ``ray.init(num_cpus=2, include_dashboard=False)``: a
local cluster of this machine's size without the dashboard's extra processes.
"""

from __future__ import annotations

import json
import sys
import time

WARM_UP_CALLS = 5


def measure(samples: int, warm_seconds: float = 0.0) -> dict[str, object]:
    import ray  # only in the Ray interpreter

    start = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    init_seconds = time.perf_counter() - start
    try:

        @ray.remote
        class Answer:
            def f(self) -> int:
                return 42

        actor = Answer.remote()
        calls, warm_start = 0, time.perf_counter()
        # the actor's process is up, the path is warm and so is the machine
        while calls < WARM_UP_CALLS or time.perf_counter() - warm_start < warm_seconds:
            ray.get(actor.f.remote())
            calls += 1
        times = []
        for _ in range(samples):
            start = time.perf_counter()
            value = ray.get(actor.f.remote())
            times.append(time.perf_counter() - start)
            if value != 42:
                raise RuntimeError(f"the actor answered {value!r}")
        return {"ray": ray.__version__, "samples": times, "init_seconds": init_seconds}
    finally:
        ray.shutdown()


if __name__ == "__main__":
    if len(sys.argv) > 3 or not all(arg.replace(".", "", 1).isdigit() for arg in sys.argv[1:]):
        # perf.py's helper, not a command of its own: ``--help`` gets the usage, not a trace
        sys.exit(
            "usage: RAY_PYTHON benchmarks/perf_ray.py [SAMPLES [WARM_SECONDS]] (perf.py runs it)"
        )
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    warm = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    print(json.dumps(measure(max(1, count), warm)), flush=True)
