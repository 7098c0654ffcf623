"""Per-GPU lease arbiter (SERVER.md §5, §11).

The front-end, not an OS lock, decides who may touch a GPU, so a killed holder can never
wedge a device: its lease is simply released by the front-end.

One queue serves every GPU. A waiter asks either for specific GPUs (an ordinary lease, or
re-acquiring a set) or for "any k free GPUs" (a new GPU set). A waiter is granted only when
everything it needs is free and no waiter ahead of it still wants any of it, which gives
atomic sets that are never starved by single leases (an "any k" waiter blocks every GPU for
those behind it).

Identities take turns by the time they held the GPUs (SERVER §5): the queue is in arrival
order within each identity, and of the identities waiting, the one that held the GPUs its
waiter may take least lately (``hold_time``) goes first: every identity's first waiter in
that order, then every identity's second, and so on. Ties (identities that have not held
them, a frozen clock) go in turn order: an identity that was just granted a lease takes its
next turn after every other waiting identity's. Before, turns counted grants, so a user of
10 ms kernels got one grant per 2 s beside a neighbour holding the GPU 2 s a grant; and
before turns at all, one identity's seated burst of set requests held another's single
lease behind all of them (team soak: bob's 0.1 s job waited 13.5 s behind nine of alice's
``--gpus 4`` jobs while its queue position said 1). Waiters of no identity (a worker's
start-up, or the teardown of one that never served a request) are the server's own: they go
first, in arrival order, take no turn and are charged no hold time. As one more identity,
a start-up took a turn from the users, and the CUDA start-ups it was charged (a few seconds
each) put it behind every user that had held the GPU less: a seat's new worker waited
while the users' programs, seated on the others, took the GPU in turn. A start-up made for
an identity (a session's worker, the fresh worker of a seat that served another identity)
is that identity's waiter instead: as the server's own, one token holder creating and
ending sessions in a loop would put a start-up ahead of every other user's program each
time. The server's own are bounded by the seats (one start-up each at a time), and a user
makes one only by a program of its own (a crash, a retirement), which took that user's turn.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from kcoral_server.gpu.hold_time import RecentHoldTime

HISTORY_LENGTH = 256


class GpuQuarantined(Exception):
    """A GPU the waiter needs was quarantined: it is never granted again (SERVER §11)."""


@dataclass
class HolderRecord:
    """One tenure of a GPU: who held it and when (``end`` is None while held)."""

    request_id: str | None
    start: float
    end: float | None = None


@dataclass
class _Waiter:
    owner: object
    request_id: str | None
    wanted: tuple[int, ...] | None  # specific GPUs, or None for "any `count`"
    count: int
    future: asyncio.Future[tuple[int, ...]] = field(repr=False)
    identity: str | None = None


class LeaseArbiter:
    """FIFO lease arbiter over a fixed list of GPU ids (in ``--gpus`` order)."""

    def __init__(
        self, gpu_ids: Sequence[int], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.gpu_ids = list(dict.fromkeys(gpu_ids))
        #: monotonic seconds (a test's own clock times holds without waiting them out)
        self._clock = clock
        self._holder: dict[int, object | None] = {gpu: None for gpu in self.gpu_ids}
        self._history: dict[int, deque[HolderRecord]] = {
            gpu: deque(maxlen=HISTORY_LENGTH) for gpu in self.gpu_ids
        }
        self._waiters: list[_Waiter] = []
        #: how many waiters each owner has queued: a GPU its owner holds stays open to them
        self._waiting_owners: Counter[object] = Counter()
        #: the waiting identities, whose turn first among equals (module docstring)
        self._turns: list[str | None] = []
        #: who holds each held GPU, charged its hold time when it gives the GPU back
        self._holder_identity: dict[int, str | None] = {}
        self._recent_hold_time = RecentHoldTime()
        #: seconds each GPU's ended tenures lasted (the metrics' busy time, EXTENSIONS §13)
        self._held_seconds: dict[int, float] = {gpu: 0.0 for gpu in self.gpu_ids}
        #: GPUs taken out of service because a worker's clean-up could not be confirmed
        self.quarantined: set[int] = set()

    # ------------------------------------------------------------------ queries

    def holder(self, gpu: int) -> object | None:
        return self._holder.get(gpu)

    def holds(self, owner: object, gpus: Sequence[int]) -> bool:
        return all(self._holder.get(gpu) is owner for gpu in gpus)

    def waiting(self, gpu: int | None = None) -> int:
        """Number of waiters (for ``gpu``, or in total)."""
        if gpu is None:
            return len(self._waiters)
        return sum(1 for w in self._waiters if w.wanted is None or gpu in w.wanted)

    def history(self, gpu: int) -> list[HolderRecord]:
        return list(self._history.get(gpu, ()))

    def held_seconds(self, gpu: int, now: float | None = None) -> float:
        """How long ``gpu``'s lease has been held since start, the current tenure included
        (a counter that grows while a long program runs, not only when it ends)."""
        now = self._clock() if now is None else now
        held = self._held_seconds.get(gpu, 0.0)
        history = self._history.get(gpu)
        if self._holder.get(gpu) is not None and history and history[-1].end is None:
            held += max(0.0, now - history[-1].start)
        return held

    def request_at(self, gpu: int, when: float) -> str | None:
        """Request id holding ``gpu`` at monotonic time ``when`` (for ``interfered_request_id``)."""
        for record in reversed(self._history.get(gpu, ())):
            if record.start <= when and (record.end is None or when <= record.end):
                return record.request_id
        return None

    # ------------------------------------------------------------------ acquire / release

    async def acquire(
        self,
        owner: object,
        gpus: Sequence[int] | None = None,
        *,
        count: int = 1,
        request_id: str | None = None,
        identity: str | None = None,
    ) -> tuple[int, ...]:
        """Wait until ``owner`` holds ``gpus`` (or any ``count`` free GPUs); return them.
        ``identity`` is whose turn the wait takes (module docstring).

        Cancelling the wait withdraws the request (nothing stays held). ``GpuQuarantined``
        when the request can no longer be met (at once, or when a GPU is quarantined later).
        """
        wanted = None if gpus is None else tuple(dict.fromkeys(gpus))
        if wanted is not None:
            unknown = [gpu for gpu in wanted if gpu not in self._holder]
            if unknown:
                raise ValueError(f"unknown GPU ids {unknown}")
            if self._unmeetable(wanted, count):
                raise self._refusal()
            if all(self._holder[gpu] is owner for gpu in wanted):
                return wanted  # re-entrant: already held
        elif not 1 <= count <= len(self.gpu_ids):
            raise ValueError(f"cannot lease {count} of {len(self.gpu_ids)} GPUs")
        elif self._unmeetable(None, count):
            raise self._refusal()
        future: asyncio.Future[tuple[int, ...]] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(owner, request_id, wanted, count, future, identity)
        self._waiters.append(waiter)
        self._waiting_owners[owner] += 1
        if identity is not None and identity not in self._turns:
            self._turns.append(identity)
        self._grant()
        try:
            return await future
        except asyncio.CancelledError:
            if waiter in self._waiters:
                self._leave([waiter])
                self._grant()
            elif future.done() and not future.cancelled():
                # Granted in the same tick as the cancellation: give it back.
                self.release(owner, future.result())
            raise

    def release(self, owner: object, gpus: Sequence[int] | None = None) -> None:
        """Give back ``gpus`` (default: every GPU ``owner`` holds). No-op for GPUs not held."""
        now = self._clock()
        targets = self.gpu_ids if gpus is None else gpus
        changed = False
        for gpu in targets:
            if self._holder.get(gpu) is owner and owner is not None:
                self._holder[gpu] = None
                history = self._history[gpu]
                if history and history[-1].end is None:
                    history[-1].end = now
                    held = max(0.0, now - history[-1].start)
                    self._held_seconds[gpu] += held
                    identity = self._holder_identity.pop(gpu, None)
                    if identity is not None:  # the server's own holds are nobody's turn
                        self._recent_hold_time.charge(identity, gpu, held, now)
                changed = True
        if changed:
            self._grant()

    def quarantine(self, gpus: Sequence[int]) -> None:
        """Never grant ``gpus`` again; waiters that can no longer be served get
        ``GpuQuarantined``. Whoever holds them keeps holding them until it releases."""
        self.quarantined.update(gpu for gpu in gpus if gpu in self._holder)
        # every waiter it leaves unmeetable, however far back: a pass stops early (_grant)
        refused = [w for w in self._waiters if self._unmeetable(w.wanted, w.count)]
        self._leave(refused)
        for waiter in refused:
            if not waiter.future.done():
                waiter.future.set_exception(self._refusal())
        self._grant()

    def _unmeetable(self, wanted: tuple[int, ...] | None, count: int) -> bool:
        if wanted is not None:
            return any(gpu in self.quarantined for gpu in wanted)
        return count > len(self.gpu_ids) - len(self.quarantined)

    def _refusal(self) -> GpuQuarantined:
        return GpuQuarantined(f"GPUs {sorted(self.quarantined)} are quarantined")

    def withdraw(self, owner: object) -> None:
        """Cancel every pending request of ``owner`` (e.g. a worker being killed)."""
        leaving = [w for w in self._waiters if w.owner is owner]
        self._leave(leaving)
        for waiter in leaving:
            if not waiter.future.done():
                waiter.future.cancel()
        self._grant()

    def _leave(self, leaving: Sequence[_Waiter]) -> None:
        """Take ``leaving`` out of the queue in one pass over it (a ``list.remove`` each
        made a pass that cleaned many waiters quadratic)."""
        for waiter in leaving:
            self._count_out(waiter)
        self._drop(leaving)

    def _count_out(self, waiter: _Waiter) -> None:
        self._waiting_owners[waiter.owner] -= 1
        if self._waiting_owners[waiter.owner] <= 0:
            del self._waiting_owners[waiter.owner]

    def _drop(self, leaving: Sequence[_Waiter]) -> None:
        if leaving:
            gone = {id(waiter) for waiter in leaving}
            self._waiters = [waiter for waiter in self._waiters if id(waiter) not in gone]

    def _in_turns(self, now: float) -> Iterator[_Waiter]:
        """The waiters in serving order: by rank within their identity, then by the time
        their identity held the GPUs they may take, then by turn. Each rank is sorted only
        once the pass reaches it: a pass stops once no GPU is left to grant (``_grant``)."""
        servers_own: list[_Waiter] = []
        queues: dict[str | None, list[_Waiter]] = {identity: [] for identity in self._turns}
        for waiter in self._waiters:
            if waiter.identity is None:
                servers_own.append(waiter)
            else:
                queues.setdefault(waiter.identity, []).append(waiter)
        yield from servers_own  # first, in arrival order (module docstring)
        turn = {identity: place for place, identity in enumerate(queues)}
        held: dict[tuple[str | None, tuple[int, ...] | None], float] = {}

        def owed_first(waiter: _Waiter) -> tuple[float, int]:
            key = (waiter.identity, waiter.wanted)
            if key not in held:
                # an "any k" waiter may take any GPU, and holds them all off for those
                # behind it
                gpus = self.gpu_ids if waiter.wanted is None else waiter.wanted
                held[key] = self._recent_hold_time.of(waiter.identity, gpus, now)
            return held[key], turn[waiter.identity]

        for rank in range(max(map(len, queues.values()), default=0)):
            ranked = [queue[rank] for queue in queues.values() if rank < len(queue)]
            yield from sorted(ranked, key=owed_first)

    def _closed(self, blocked: set[int]) -> bool:
        """Whether no waiter left in this pass could be granted anything: every GPU is
        blocked, quarantined, or held by an owner with nothing queued."""
        return all(
            gpu in blocked
            or gpu in self.quarantined
            or (holder is not None and holder not in self._waiting_owners)
            for gpu, holder in self._holder.items()
        )

    def _grant(self) -> None:
        """One pass over the waiters in turn order, granting each whose GPUs are free and
        wanted by no waiter before it. Linear in the waiters it reaches, and it stops once
        every GPU is held or blocked: at 500 waiters a grant looked at all 500 (and each
        one removed was a ``list.remove``)."""
        blocked: set[int] = set()
        now = self._clock()
        leaving: list[_Waiter] = []
        for waiter in self._in_turns(now):
            if self._closed(blocked):
                break
            if waiter.future.done() or self._unmeetable(waiter.wanted, waiter.count):
                leaving.append(waiter)
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
                # Waiters behind it must not overtake on anything this one still wants.
                blocked.update(self.gpu_ids if waiter.wanted is None else waiter.wanted)
                continue
            leaving.append(waiter)
            self._count_out(waiter)  # the GPUs it holds now are closed to the rest
            if waiter.identity is not None:
                self._turns.remove(waiter.identity)
                self._turns.append(waiter.identity)  # its next turn after the others'
            for gpu in chosen:
                if self._holder[gpu] is not waiter.owner:
                    self._holder[gpu] = waiter.owner
                    self._holder_identity[gpu] = waiter.identity
                    self._history[gpu].append(HolderRecord(waiter.request_id, now))
            waiter.future.set_result(chosen)
        self._drop(leaving)
        waiting = {waiter.identity for waiter in self._waiters}
        self._turns = [identity for identity in self._turns if identity in waiting]
