"""Admission queue in front of slot selection (ROUTER.md §7.3): bounded, timed, FIFO within
an identity with the identities waiting in turn (as a server's seat queue, SERVER §4)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, MutableSequence
from dataclasses import dataclass, field

from kcoral.protocol.selector import Selector, format_selector
from kcoral_server.execution.control import handed_over, served_in_turn
from kcoral_server.router.admission.selection import (
    LongHold,
    no_match_message,
    seatable_gpu_count,
    serves,
    share_held_message,
    within_share,
)
from kcoral_server.router.nodes.registry import NodeRecord, Registry
from kcoral_server.router.nodes.slot import RouterSlot

Lease = tuple[NodeRecord, RouterSlot]


class RouterBusy(Exception):
    """The admission queue is full, or the caller's share of it (503 ``router_busy``)."""

    finish_reason = "queue_full"

    def __init__(self, message: str = "router queue is full") -> None:
        super().__init__(message)


class ControlShareHeld(RouterBusy):
    """A long-held request waited out the queue wait past its identity's share of its
    node's control slots (``selection.within_share``; 503 ``router_busy``, saying so)."""

    finish_reason = "queue_timeout"


class NoNode(Exception):
    """No eligible slot within the queue wait (503 ``no_node``)."""


class RouterStopping(NoNode):
    """The router stops: no request waits for a slot any more (503 ``no_node``, said so)."""


class NodeGone(NoNode):
    """The one node a request must reach (its job's) is not connected (503 ``no_node``,
    naming it: the request is not waiting for a free slot, and no other node can serve it)."""

    def __init__(self, node_id: str) -> None:
        super().__init__(node_id)
        self.node_id = node_id


class NoMatchingNode(NoNode):
    """Every node a queued request's selector fits has left the router (503
    ``no_matching_node``, as a request with that selector arriving now gets, ROUTER §7)."""


@dataclass(eq=False)
class _Waiter:
    affinity: str | None
    request_id: str
    future: asyncio.Future[Lease]
    selector: Selector = field(default_factory=dict)  # worker waiters only (ROUTER §7)
    long: LongHold | None = None  # control waiters only: holds its slot long
    identity: str = ""  # whose request it is (whose turn it waits for, whose share it counts)
    gpu_count: int | None = None  # worker waiters only: the GPUs its program needs


async def wait_for_slot(
    registry: Registry, waiters: MutableSequence[_Waiter], waiter: _Waiter, wait: float
) -> Lease:
    """Wait (queued in ``waiters``) until ``waiter`` is handed a slot; ``NoNode`` after
    ``wait`` seconds. A waiter cancelled (client gone) always raises, and gives back a slot
    handed over before its task ran again."""
    try:
        return await handed_over(
            waiter.future, wait, NoNode, lambda lease: registry.release(lease[1])
        )
    finally:
        if waiter in waiters:
            waiters.remove(waiter)


class _WaitingRoom:
    """What both admissions share: their bounds, their waiters, and the router's stop."""

    def __init__(
        self,
        registry: Registry,
        max_queued: int,
        wait_timeout: float,
        waiters: MutableSequence[_Waiter],
    ) -> None:
        self.registry = registry
        self.max_queued = max_queued
        self.wait_timeout = wait_timeout
        self._waiters = waiters
        self.closed = False  # the router stops: no request waits any more
        #: how many identities the client tokens name, asked at each request (a reload may
        #: change it): with two or more, one holds at most half of the queue
        self.identities: Callable[[], int | None] = lambda: None

    def shared(self) -> bool:
        """Whether identities share (two or more in the client token file)."""
        identities = self.identities()
        return identities is not None and identities >= 2

    def _queue_place(self, identity: str) -> asyncio.Future[Lease]:
        """The future of a request about to wait, in either waiting room: ``RouterBusy``
        where the queue is full, or ``identity`` holds its share of it (``_check_share``)."""
        if self.waiting >= self.max_queued:
            raise RouterBusy
        self._check_share(identity)
        return asyncio.get_running_loop().create_future()

    def _check_share(self, identity: str) -> None:
        """Who can reach the queue: every client-token holder, one connection per waiting
        request. Its bound was shared: one identity's requests filled it and every other
        identity's got 503 at once. With two or more identities, one holds at most half of
        it, rounded up (a server's job slots, EXTENSIONS §5); past it, ``RouterBusy`` says so.
        Both waiting rooms (programs; control requests) keep this rule, each for its own
        bound."""
        if not identity or not self.shared() or not self.max_queued:
            return  # identity "": the router's own request (a revocation, a session's end)
        share = -(-self.max_queued // 2)
        held = sum(1 for w in self._waiters if w.identity == identity and not w.future.done())
        if held >= share:
            requests = "request" if held == 1 else "requests"  # a bound of 1 or 2: one
            raise RouterBusy(
                f"router queue: you hold {held} {requests} waiting for a node, the most one "
                f"identity may (half of --max-queued-requests {self.max_queued}); send again "
                "once one of yours has reached a node"
            )

    def close(self) -> None:
        """The router stops: every waiter fails with ``RouterStopping`` (503 ``no_node``,
        nothing reached a node), and so does every later ``acquire``. A waiter holds its
        connection open, and the router's stop waits for every connection: one left queued
        held the stop for up to the queue wait (1800 s)."""
        self.closed = True
        for waiter in list(self._waiters):
            if not waiter.future.done():
                waiter.future.set_exception(RouterStopping())

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.future.done())


class Admission(_WaitingRoom):
    def __init__(self, registry: Registry, max_queued: int, wait_timeout: float) -> None:
        super().__init__(registry, max_queued, wait_timeout, deque())
        #: the identities waiting, in the order of their turns (a served one goes last)
        self._turns: dict[str, None] = {}

    def queued_needs(self) -> list[tuple[Selector, int | None]]:
        """What each waiting request needs, oldest first, for ``/v1/info``'s
        ``fleet_status`` (ROUTER §6): its selector (``{}``: the default kind, where a request
        without one goes) and the GPUs its program asks for (None: any node)."""
        return [(w.selector, w.gpu_count) for w in self._waiters if not w.future.done()]

    async def acquire(
        self,
        affinity: str | None,
        request_id: str,
        selector: Selector | None = None,
        identity: str = "",
        gpu_count: int | None = None,
    ) -> Lease:
        if self.closed:
            raise RouterStopping
        # Only nodes with the GPUs a program asks for, where one has them (ROUTER §7).
        gpu_count = seatable_gpu_count(self.registry, selector or {}, gpu_count)
        if not self._waiters:
            lease = self.registry.select(affinity, request_id, selector, gpu_count)
            if lease is not None:
                return lease
        future = self._queue_place(identity)
        selector = dict(selector or {})
        waiter = _Waiter(affinity, request_id, future, selector, identity=identity)
        waiter.gpu_count = gpu_count
        self._waiters.append(waiter)
        self.wake()
        return await wait_for_slot(self.registry, self._waiters, waiter, self.wait_timeout)

    def in_turn(self) -> list[_Waiter]:
        """The waiters in the order they are served: each identity's oldest first, the
        identities in turn (one identity: arrival order). Before, one client's burst held
        every other client's requests behind all of it (team soak)."""
        by_identity: dict[str, list[_Waiter]] = {}
        for waiter in self._waiters:
            if not waiter.future.done():
                by_identity.setdefault(waiter.identity, []).append(waiter)
        order = [i for i in self._turns if i in by_identity]
        order += [i for i in by_identity if i not in self._turns]
        self._turns = dict.fromkeys(order)
        return served_in_turn([by_identity[identity] for identity in order])

    def wake(self) -> None:
        """Serve waiters in turn (``in_turn``) while slots are available.

        Waiters with one selector (no selector: the default kind) compete for the same
        nodes, and among them the one whose turn comes first is served first; once one finds
        no slot, later ones with its selector are passed over in this round, and a waiter
        whose selector asks for other nodes is not held back behind it (ROUTER §7)."""
        starved: set[tuple[str, int | None]] = set()
        unfit: dict[str, bool] = {}
        for waiter in [w for w in self._waiters if w.future.done()]:
            self._waiters.remove(waiter)
        seatable: dict[tuple[str, int], int | None] = {}  # each asked once a round
        for waiter in self.in_turn():
            wanted = format_selector(waiter.selector)
            if waiter.gpu_count is not None:
                # Its nodes with the GPUs left: it goes where a node's 400 says why, as before,
                # rather than waiting out the queue wait for them.
                key = (wanted, waiter.gpu_count)
                if key not in seatable:
                    seatable[key] = seatable_gpu_count(self.registry, waiter.selector, key[1])
                waiter.gpu_count = seatable[key]
            if (wanted, waiter.gpu_count) in starved:
                continue
            if waiter.selector and unfit.setdefault(wanted, not self._fits_any(waiter.selector)):
                # Its nodes left (a drain, a lost stream): it would wait out the queue
                # wait (1800 s) for them, while the same request arriving now is refused.
                message = no_match_message(self.registry, waiter.selector)
                self._waiters.remove(waiter)
                waiter.future.set_exception(NoMatchingNode(message))
                continue
            lease = self.registry.select(
                waiter.affinity, waiter.request_id, waiter.selector, waiter.gpu_count
            )
            if lease is None:
                starved.add((wanted, waiter.gpu_count))
                continue
            self._waiters.remove(waiter)
            self._turns.pop(waiter.identity, None)  # its next turn: after the others'
            self._turns[waiter.identity] = None
            waiter.future.set_result(lease)

    def _fits_any(self, selector: Selector) -> bool:
        """Whether a connected node, ready or not (a busy or recovering one comes back),
        fits ``selector``."""
        default = self.registry.default_kind
        return any(
            n.connected and serves(n, selector, default) for n in self.registry.nodes.values()
        )


class ControlAdmission(_WaitingRoom):
    """Waiters for control slots (``/v1/info``, job reads and cancels, event streams).

    Unlike ``Admission`` there is no head-of-line blocking: a waiter bound to one node (a
    job's node) must not hold back a waiter that any other node could serve. A waiter bound
    to a node that is not connected fails at once with ``NodeGone``.
    """

    def __init__(self, registry: Registry, max_queued: int, wait_timeout: float) -> None:
        super().__init__(registry, max_queued, wait_timeout, [])

    async def acquire(
        self,
        node_id: str | None,
        request_id: str,
        timeout: float | None = None,
        *,
        spare: bool = False,
        identity: str = "",
    ) -> Lease:
        """A control slot; ``spare``: only where another stays free (a request that holds
        its slot long: an event stream, a session's program, a result), and, where
        identities share, within ``identity``'s share of the node (``within_share``)."""
        if self.closed:
            raise RouterStopping
        self._check_node(node_id)
        long = LongHold(identity, self.shared()) if spare else None
        lease = self.registry.select_control(node_id, request_id, long)
        if lease is not None:
            return lease
        future = self._queue_place(identity)
        waiter = _Waiter(node_id, request_id, future, long=long, identity=identity)
        self._waiters.append(waiter)
        wait = self.wait_timeout if timeout is None else min(timeout, self.wait_timeout)
        try:
            return await wait_for_slot(self.registry, self._waiters, waiter, wait)
        except NoNode as exc:
            if type(exc) is NoNode and (held := self._past_share(waiter)) is not None:
                raise ControlShareHeld(held) from None
            raise

    def _past_share(self, waiter: _Waiter) -> str | None:
        """Why ``waiter`` waited out the queue wait, where its identity's share of its node
        held it back."""
        node = self.registry.nodes.get(waiter.affinity or "")
        if waiter.long is None or node is None or within_share(node, waiter.long):
            return None
        return share_held_message(node, waiter.identity)

    def _check_node(self, node_id: str | None) -> None:
        if node_id is None:
            return
        node = self.registry.nodes.get(node_id)
        if node is None or not node.reachable():
            raise NodeGone(node_id)

    def wake(self) -> None:
        """Serve every waiter that can be served now, oldest first."""
        for waiter in list(self._waiters):
            if waiter.future.done():
                continue
            try:
                self._check_node(waiter.affinity)
            except NodeGone as gone:
                waiter.future.set_exception(gone)
                continue
            lease = self.registry.select_control(waiter.affinity, waiter.request_id, waiter.long)
            if lease is not None:
                waiter.future.set_result(lease)
