"""The change of a candidate between two runs of one history key (EXTENSIONS §12.6).

Two things differ from a comparison's speedup (§12.2), whose candidates share the rounds
of one run. First, the ratio is of the medians the user saw: the new result's own median
over every call and the one the previous line records, not of the samples the history
keeps (200, thinned in call order), whose median may lie a per cent or two away: a run of
unchanged code read ``0.98× [0.978, 0.997] faster`` while its table and the file said
0.2640 ms against 0.2657 ms. Second, two runs are minutes or days apart: clocks,
temperature, neighbours and memory placement move every call of a run together, which no
bootstrap over one run's calls can see, so a change counts only when its whole interval
lies beyond ``RUN_TO_RUN_NOISE``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import median
from typing import Any

import numpy as np

from kcoral.bench.cpu_share import busy_threshold
from kcoral.bench.stats import NO_DIFFERENCE, ratio_of_medians

#: How far two runs of unchanged code may differ with nothing changed but the machine's
#: state (a few per cent on a CPU, one or two on a GPU): a change must pass it to count.
RUN_TO_RUN_NOISE = 0.05
#: The verdict of a change whose interval excludes 1 but not the noise band around it.
WITHIN_NOISE = f"not beyond {RUN_TO_RUN_NOISE:.0%} noise"


def run_to_run_change(
    samples: Sequence[float],
    old_samples: Sequence[float],
    new_median: float,
    old_median: float | None,
    seed: int,
) -> dict[str, Any]:
    """new median / old median with a bootstrap 95 % interval, its ``verdict`` (``slower``,
    ``faster``, ``not beyond 5% noise`` or ``no significant difference``) and
    ``regression`` (``slower``: the whole interval above 1 + ``RUN_TO_RUN_NOISE``).

    The interval is the bootstrap's over the samples, scaled by the ratio of the stated
    medians over the samples' own, so it is centred where the value is."""
    change = ratio_of_medians(samples, old_samples, seed)
    sampled = change["value"]
    if old_median is None or old_median < 0:
        old_median = float(median(old_samples))
    stated = ratio_of_medians([new_median], [old_median], seed)["value"]
    change["value"] = stated
    low, high = change["ci95_low"], change["ci95_high"]
    if low is None or high is None:
        change["regression"] = False
        return change
    if sampled > 0 and stated != sampled:
        limit = float(np.finfo(float).max)
        low, high = (min(bound * stated / sampled, limit) for bound in (low, high))
        # a bound capped at the largest float (a previous median of 0) stays around the value
        low, high = min(low, stated), max(high, stated)
        change["ci95_low"], change["ci95_high"] = low, high
    if low > 1 + RUN_TO_RUN_NOISE:
        verdict = "slower"
    elif high < 1 / (1 + RUN_TO_RUN_NOISE):
        verdict = "faster"
    elif low > 1 or high < 1:
        verdict = WITHIN_NOISE
    else:
        verdict = NO_DIFFERENCE
    change["verdict"] = verdict
    change["regression"] = verdict == "slower"
    return change


#: What of a run's setup, besides the software versions, moves its times: the L2 flush (a
#: warm cache flatters every call), locked GPU clocks (boost clocks run faster, then
#: throttle), and on a CPU worker the CPU and how many it may use.
_SETUP_NAMES = {
    "flush_l2": "L2 flush",
    "clocks_locked": "GPU clocks locked",
    "cpu_model": "CPU",
    "usable_cpus": "usable CPUs",
}


def setup_of(result: Mapping[str, Any]) -> dict[str, Any]:
    """The setup a result was measured in (only what it says): ``flush_l2``, on a GPU worker
    ``clocks_locked``, on a CPU worker ``cpu_model`` and ``usable_cpus``. The key of a CPU
    run is ``cpu`` on every machine, so this is what tells a laptop's run from a server's."""
    found: dict[str, Any] = {}
    if isinstance(result.get("flush_l2"), bool):
        found["flush_l2"] = result["flush_l2"]
    gpu = result.get("gpu_state")
    if isinstance(gpu, Mapping) and isinstance(gpu.get("clocks_locked"), bool):
        found["clocks_locked"] = gpu["clocks_locked"]
    machine = result.get("machine")
    if isinstance(machine, Mapping):
        if isinstance(machine.get("cpu_model"), str):
            found["cpu_model"] = machine["cpu_model"][:200]  # a rogue server's: any length
        cpus = machine.get("usable_cpus")
        if isinstance(cpus, int) and not isinstance(cpus, bool):
            found["usable_cpus"] = cpus
        others = machine.get("others_busy_cpus")
        if isinstance(others, (int, float)) and not isinstance(others, bool):
            found["others_busy_cpus"] = others  # not a setup to match: a state to report
    return found


def setup_warnings(now: Mapping[str, Any], before: object) -> list[str]:
    """One warning per setup value that differs from the previous line's ``setup``, and one
    when other processes shared the previous run's CPUs (this run's own result says so for
    itself): a change against a run slowed by its neighbours is their doing."""
    if not isinstance(before, Mapping):
        return []
    found = []
    others, cpus = before.get("others_busy_cpus"), before.get("usable_cpus")
    if isinstance(others, (int, float)) and isinstance(cpus, int) and cpus > 0:
        if math.isfinite(others) and others >= busy_threshold(cpus):
            found.append(
                f"history: other processes kept {others:g} of the {cpus} CPUs busy during "
                "the previous run, so a change may come from them"
            )
    return found + [
        f"history: this run's {label} ({now[name]!r}) differs from the previous run's "
        f"({before[name]!r}), so a change may come from it"
        for name, label in _SETUP_NAMES.items()
        if name in now and name in before and now[name] != before[name]
    ]
