"""The GPU lease arbiter's cost of a grant with many waiters: its pass as it is (now, it
stops once every GPU is held or blocked) against the whole pass over the queue it made
before (111c2ff, written out here), in the same run.

One GPU (or ``--gpus`` of them, each waiter wanting one), ``--waiters`` waiters of
``--identities`` identities queued in turn; each identity holds its grants for a different
time (identity k: k + 1 ms, on the arbiter's own clock, so holds differ without waiting
them out). A grant is timed from ``release`` of the GPU to the next waiter granted it
(``release`` runs the arbiter's whole pass over its queue); the granted waiter's identity
queues one more, so the queue stays at its length. Alternating blocks, each first in turn;
prints CPU microseconds per grant (median of the blocks) and the ratio now / before.

    python benchmarks/lease_turns.py [--waiters 50 500] [--identities 5] [--gpus 1]
        [--grants 400] [--blocks 10]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from kcoral_server.gpu.lease import HolderRecord, LeaseArbiter, _Waiter


class WholePass(LeaseArbiter):
    """The arbiter's pass as it was before it stopped early (111c2ff): every waiter sorted
    and looked at on every grant, and each one that left the queue a ``list.remove``."""

    def _in_turns(self, now: float) -> list[_Waiter]:  # type: ignore[override]
        return list(super()._in_turns(now))

    def _grant(self) -> None:
        blocked: set[int] = set()
        now = self._clock()
        for waiter in self._in_turns(now):
            if waiter.future.done() or self._unmeetable(waiter.wanted, waiter.count):
                self._waiters.remove(waiter)
                self._count_out(waiter)
                if not waiter.future.done():
                    waiter.future.set_exception(self._refusal())
                continue
            if waiter.wanted is not None:
                chosen: tuple[int, ...] | None = waiter.wanted
                if any(
                    gpu in blocked or self._holder[gpu] not in (None, waiter.owner)
                    for gpu in waiter.wanted
                ):
                    chosen = None
            else:
                free = [
                    gpu
                    for gpu in self.gpu_ids
                    if gpu not in blocked
                    and gpu not in self.quarantined
                    and self._holder[gpu] is None
                ]
                chosen = tuple(free[: waiter.count]) if len(free) >= waiter.count else None
            if chosen is None:
                blocked.update(self.gpu_ids if waiter.wanted is None else waiter.wanted)
                continue
            self._waiters.remove(waiter)
            self._count_out(waiter)
            self._turns.remove(waiter.identity)
            self._turns.append(waiter.identity)
            for gpu in chosen:
                if self._holder[gpu] is not waiter.owner:
                    self._holder[gpu] = waiter.owner
                    self._holder_identity[gpu] = waiter.identity
                    self._history[gpu].append(HolderRecord(waiter.request_id, now))
            waiter.future.set_result(chosen)
        waiting = {waiter.identity for waiter in self._waiters}
        self._turns = [identity for identity in self._turns if identity in waiting]


class Clock:
    """Monotonic seconds that move only by the holds the benchmark gives."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def seconds_per_grant(
    kind: type[LeaseArbiter], waiters: int, identities: int, gpus: int, grants: int
) -> float:
    clock = Clock()
    arbiter = kind(list(range(gpus)), clock=clock)
    names = [f"user-{k}" for k in range(identities)]
    tasks: list[asyncio.Task[tuple[int, ...]]] = []

    async def queue(identity: str) -> None:
        owner = f"{identity}#{len(tasks)}"
        wanted = [len(tasks) % gpus]
        tasks.append(asyncio.ensure_future(arbiter.acquire(owner, wanted, identity=identity)))
        await asyncio.sleep(0)  # queued now

    for gpu in range(gpus):
        await arbiter.acquire(f"first-{gpu}", [gpu], identity="first")
    for index in range(waiters):
        await queue(names[index % identities])
    spent = 0.0
    for grant in range(grants):
        gpu = grant % gpus
        holder = arbiter.holder(gpu)
        assert isinstance(holder, str)
        identity = holder.split("#")[0]
        clock.now += 0.001 * (names.index(identity) + 1 if identity in names else 1)
        started = time.process_time()  # CPU: a loaded machine preempts, not slows, it
        arbiter.release(holder)
        spent += time.process_time() - started
        granted = arbiter.holder(gpu)
        assert isinstance(granted, str) and granted != holder, "no waiter was granted"
        await queue(granted.split("#")[0])
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return spent / grants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiters", type=int, nargs="+", default=[50, 500])
    parser.add_argument("--identities", type=int, default=5)
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--grants", type=int, default=400)
    parser.add_argument("--blocks", type=int, default=10)
    options = parser.parse_args()
    kinds = {"before (whole pass)": WholePass, "now (stops early)": LeaseArbiter}
    print(
        f"{options.identities} identities, {options.gpus} GPU(s), {options.grants} grants a block"
    )
    for waiters in options.waiters:
        per_grant: dict[str, list[float]] = {name: [] for name in kinds}
        for block in range(options.blocks):
            order = list(kinds.items())
            for name, kind in order if block % 2 else reversed(order):
                seconds = asyncio.run(
                    seconds_per_grant(
                        kind, waiters, options.identities, options.gpus, options.grants
                    )
                )
                per_grant[name].append(seconds)
        before, now = (statistics.median(times) * 1e6 for times in per_grant.values())
        print(
            f"{waiters:5d} waiters: before {before:7.1f} us a grant, now {now:7.1f} us,"
            f" ratio {now / before:.2f}"
        )


if __name__ == "__main__":
    main()
