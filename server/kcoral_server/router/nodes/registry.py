"""Node records, their states (ROUTER.md §6), their slots and slot selection (§7.1–§7.2)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import grpc

from kcoral.protocol.selector import Selector
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.router.admission.selection import LongHold, has_gpus, serves, within_share
from kcoral_server.router.nodes.slot import CONTROL, WORKER, RouterSlot
from kcoral_server.router.settings import RouterSettings

STARTING, READY, RECOVERING, INCOMPATIBLE, UNHEALTHY = (
    "starting",
    "ready",
    "recovering",
    "incompatible",
    "unhealthy",
)
#: a node stopping on purpose (its supervisor's ``draining``), and one that left so: an
#: operator's drain is not a failure (it read ``unhealthy``, and its alerts fired)
DRAINING, LEFT = "draining", "left"

#: why ``Registry.on_node_lost`` is called when a node runs a new server: what lived in the
#: old one (its jobs, its sessions) is gone for good, not only out of reach
SERVER_RESTARTED = "restarted its server"
#: a supervisor's ``last_error`` before each start of its server (ROUTER §12): not a failure
#: of a node that is starting, or back after a drain (it read ``unhealthy`` at every start)
SERVER_STARTING = "KCoral Server is starting"
#: a draining supervisor's ``last_error`` once its server has stopped, in its last status
#: before it closes its stream (ROUTER §12): its drain is done, and its leave is planned
SERVER_STOPPED = "KCoral Server has stopped"
SLOT_KEY_REFUSAL = "the slot key does not match the one the node's supervisor announced"
#: The most records of disconnected nodes kept for ``--node-retention-seconds`` (ROUTER §6):
#: beyond it the oldest are forgotten first, so a node-token holder that opens streams
#: under ever new node ids cannot make the router hold a record for each. A node that
#: comes back after its record went gets a fresh one (it is never refused).
MAX_RETAINED_NODES = 1024
#: ``last_error`` is kept cut to this many characters (a supervisor's probe failure text).
MAX_LAST_ERROR_CHARS = 1024
#: the replaced server instances a node's record remembers (their slots are refused): a
#: supervisor that reports ever new instances cannot grow the record past this; a slot of
#: an instance forgotten since is kept but gets no work either (``current_slots``)
MAX_OLD_INSTANCES = 64


@dataclass(eq=False)
class SupervisorStream:
    """One ``ConnectSupervisor`` call; a newer one supersedes it only once it is silent."""

    node_id: str
    superseded: bool = False
    #: set with ``superseded``: the gateway ends the call at once, not at its next message
    #: (a half-open stream sends none, and its call lived until the router stopped)
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    def supersede(self) -> None:
        self.superseded = True
        self.ended.set()

    def end(self) -> None:
        """The router stops: the call returns (status OK) instead of being cancelled."""
        self.ended.set()


@dataclass(eq=False)
class NodeRecord:
    node_id: str
    state: str = STARTING
    stream: SupervisorStream | None = None
    connected: bool = False
    supervisor_instance_id: str = ""
    server_instance_id: str = ""
    # The slot key the supervisor announced ("" from published supervisors): only a slot
    # that presents it takes work, so the node token plus a learnt server instance id no
    # longer open seats under a live node's id (ROUTER §12).
    slot_key: str = ""
    old_instances: dict[str, None] = field(default_factory=dict)  # oldest first
    worker_count: int = 0
    busy_workers: int = 0
    target: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    # What the node is (ROUTER §6): its GPU kind ("" from published supervisors) with arch,
    # memory and count, and its operator's labels.
    kind: str = ""
    arch: str = ""
    gpus: int = 0
    memory_bytes: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    # Its recent programs and own queue, as its supervisor reports them (None from published
    # supervisors): /v1/info's fleet_status estimates waits from them (ROUTER §6).
    lease_stats: pb.LeaseStats | None = None
    last_error: str = ""
    last_status_at: float = 0.0
    # When its last healthy status came (router clock): failures take a ready node out only
    # once it has been this long without one (ROUTER §6), not after a few quick statuses.
    healthy_at: float = 0.0
    lost_at: float | None = None
    failures: int = 0
    successes: int = 0
    saturated_until: float = 0.0
    last_selected: int = 0
    slots: dict[str, RouterSlot] = field(default_factory=dict)

    def replaced(self, instance_id: str) -> None:
        """Remember ``instance_id`` as replaced, forgetting the oldest past
        ``MAX_OLD_INSTANCES`` (a node-token holder decides how many there are)."""
        self.old_instances[instance_id] = None
        while len(self.old_instances) > MAX_OLD_INSTANCES:
            del self.old_instances[next(iter(self.old_instances))]

    def take_slot_key(self, key: str) -> None:
        """The key its supervisor announces now. Slots opened before the key was announced
        (or under an older one) that do not hold it are a stranger's: they never get work
        and are closed."""
        if key == self.slot_key:
            return
        self.slot_key = key
        for slot in list(self.slots.values()):
            if not slot.holds_key(key):
                slot.close(
                    (grpc.StatusCode.PERMISSION_DENIED, SLOT_KEY_REFUSAL), "tunnel_disconnected"
                )

    def take_instance(self, server_instance_id: str) -> None:
        """A new supervisor or server instance (``server_instance_id``; "" while it has
        none): the current one is replaced, and slots of another instance can never receive
        work again (§4.4)."""
        if self.server_instance_id:
            self.replaced(self.server_instance_id)
        if server_instance_id:
            self.server_instance_id = server_instance_id
        for slot in list(self.slots.values()):
            if slot.instance_id != self.server_instance_id:
                replaced = (grpc.StatusCode.FAILED_PRECONDITION, "server instance replaced")
                slot.close(replaced, "tunnel_disconnected")

    def take_healthy_status(self, status: pb.SupervisorStatus) -> None:
        """What a healthy status says the node is and holds (ROUTER §6)."""
        self.kind, self.arch = status.kind.gpu, status.kind.arch
        self.gpus, self.memory_bytes = status.kind.gpus, status.kind.memory_bytes
        self.labels = dict(status.labels)
        self.lease_stats = status.lease_stats if status.HasField("lease_stats") else None
        self.worker_count = status.worker_count
        self.busy_workers = status.busy_workers
        self.target = dict(status.target)
        self.versions = dict(status.versions)
        self.saturated_until = 0.0

    def current_slots(self, kind: str = WORKER) -> list[RouterSlot]:
        return [
            s
            for s in self.slots.values()
            if s.kind == kind
            and s.instance_id == self.server_instance_id
            and s.holds_key(self.slot_key)
            and not s.closed.is_set()
        ]

    def reachable(self) -> bool:
        """Whether a request bound to this node (its job's) can reach it: its supervisor is
        connected, or its server's control slots are still open (a supervisor that died
        alone: the server runs on and finishes its jobs, which are read through them)."""
        return self.connected or bool(self.current_slots(CONTROL))

    def idle_slots(self, kind: str = WORKER) -> list[RouterSlot]:
        return [s for s in self.current_slots(kind) if not s.busy]

    def inflight(self) -> int:
        """Requests on worker slots (control requests are not load)."""
        return sum(1 for s in self.slots.values() if s.busy and s.kind == WORKER)

    def busy_slots(self) -> int:
        return sum(1 for s in self.slots.values() if s.busy)

    def saturated(self, now: float) -> bool:
        """No new work: a backend 503 (for a while), or a latest status that is a failure
        until the next healthy one (ROUTER §6). A draining node reports failures from its
        first moment, while it stays ``ready`` for the unhealthy threshold: each answer it
        finished freed its slot for a waiter, which its half-close then cut off (502)."""
        return now < self.saturated_until or self.failures > 0

    def load(self) -> float:
        return max(self.busy_workers, self.inflight()) / max(self.worker_count, 1)

    def free_seats(self) -> int:
        """Seats that could start a program now: idle worker slots, no more than the seats
        its supervisor last reported idle. A job frees its slot with its 202 and runs on
        its seat for as long as it takes, so idle slots alone counted busy seats as free."""
        return min(len(self.idle_slots()), max(0, self.worker_count - self.busy_workers))


def slot_refusal(
    node: NodeRecord, slot: RouterSlot, limit: int
) -> tuple[grpc.StatusCode, str] | None:
    """Why ``node`` takes no ``slot`` (ROUTER §5): the gRPC status its stream ends with."""
    if slot.slot_id in node.slots:
        return grpc.StatusCode.ALREADY_EXISTS, "slot_id already connected for this node"
    if slot.instance_id in node.old_instances:
        return grpc.StatusCode.FAILED_PRECONDITION, "server instance was replaced"
    if not slot.holds_key(node.slot_key):
        return grpc.StatusCode.PERMISSION_DENIED, SLOT_KEY_REFUSAL
    if len(node.slots) >= limit:  # a rogue node's streams without end (--max-slots-per-node)
        return (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"this node id already holds {limit} slot streams (--max-slots-per-node)",
        )
    return None


def eligible(
    node: NodeRecord,
    now: float,
    default_kind: str | None,
    selector: Selector | None = None,
    gpu_count: int | None = None,
) -> bool:
    """Ready, connected, not saturated, an idle slot, of ``default_kind`` (no selector) or
    matching ``selector``, and with ``gpu_count`` GPUs (ROUTER §6, §7)."""
    return (
        node.state == READY
        and serves(node, selector or {}, default_kind)
        and has_gpus(node, gpu_count)
        and node.connected
        and not node.saturated(now)
        and bool(node.idle_slots())
    )


def has_control_room(node: NodeRecord, long: LongHold | None) -> bool:
    """Whether ``node`` has an idle control slot for a request. One that holds its slot
    long (``long``) leaves one idle, unless the node has a single control slot in all, and
    stays within its identity's share (``selection.within_share``)."""
    idle = len(node.idle_slots(CONTROL))
    if long is None:
        return idle > 0
    spared = 1 if len(node.current_slots(CONTROL)) > 1 else 0
    return idle > spared and within_share(node, long)


class Registry:
    def __init__(
        self, settings: RouterSettings, on_change: Callable[[], None] = lambda: None
    ) -> None:
        self.settings = settings
        self.nodes: dict[str, NodeRecord] = {}
        # One compatibility baseline per kind, in the order the kinds first became healthy:
        # the first is the default kind, where requests without a selector go (ROUTER §6).
        self.baselines: dict[str, tuple[dict[str, str], dict[str, str]]] = {}
        self.on_change = on_change
        # Called with (node_id, why) when what lived on a node's server is gone for the
        # router: the node left (stream ended or stale) or its server instance changed.
        self.on_node_lost: Callable[[str, str], None] = lambda node_id, why: None
        # Called with the node id when a node that was lost reconnects with the same server.
        self.on_node_back: Callable[[str], None] = lambda node_id: None
        self._selections = 0

    # -- supervisor streams ----------------------------------------------------------------

    def attach_supervisor(self, node_id: str) -> SupervisorStream | None:
        """The new stream for ``node_id``, or None when a live one already holds the id.

        A stream is live while it is open and its last status is within
        ``--max-status-age-seconds``: a second claim then comes from another process (a
        rogue node, or a copy started by mistake) and must not take the node's traffic
        (ROUTER §4.3). A silent (half-open) stream is superseded, so a node whose old
        connection died unnoticed still gets back in.
        """
        node = self._node(node_id)
        if node.stream is not None:
            if time.monotonic() - node.last_status_at <= self.settings.max_status_age_seconds:
                return None
            node.stream.supersede()
        node.stream = SupervisorStream(node_id)
        return node.stream

    def detach_supervisor(self, stream: SupervisorStream) -> None:
        node = self.nodes.get(stream.node_id)
        if node is None or node.stream is not stream:
            return
        node.stream = None
        self._lose(node, time.monotonic())
        self.on_change()

    def apply_status(self, stream: SupervisorStream, status: pb.SupervisorStatus) -> None:
        node = self.nodes.get(stream.node_id)
        if node is None or node.stream is not stream:
            return
        now = time.monotonic()
        sup_changed = bool(node.supervisor_instance_id) and (
            status.supervisor_instance_id != node.supervisor_instance_id
        )
        server_changed = bool(status.server_instance_id) and (
            status.server_instance_id != node.server_instance_id
        )
        node.supervisor_instance_id = status.supervisor_instance_id
        node.take_slot_key(status.slot_key)
        if server_changed:  # what lived in the old server is gone, told before its slots close
            self.on_node_lost(node.node_id, SERVER_RESTARTED)
        if server_changed or sup_changed:
            node.take_instance(status.server_instance_id)
        came_back = (
            not node.connected
            and node.lost_at is not None
            and bool(node.server_instance_id)
            and not server_changed
            and not sup_changed
        )
        node.connected = True
        node.lost_at = None
        node.last_status_at = now
        if came_back:
            self.on_node_back(node.node_id)
        if status.draining:  # it finishes what it holds and takes nothing new (ROUTER §6)
            node.state, node.successes = DRAINING, 0
            node.last_error = status.last_error[:MAX_LAST_ERROR_CHARS]
        elif status.server_healthy:
            node.take_healthy_status(status)
            node.healthy_at = now
            self._success(node)
        elif status.last_error == SERVER_STARTING and node.state in (STARTING, LEFT, DRAINING):
            # DRAINING: its server drained alone (SIGTERM) and its supervisor starts a new one
            node.state, node.last_error = STARTING, SERVER_STARTING
        else:
            node.last_error = status.last_error[:MAX_LAST_ERROR_CHARS]
            self._failure(node, now)
        self.on_change()

    @property
    def default_kind(self) -> str | None:
        """The kind of requests without a selector: the first kind with a baseline."""
        return next(iter(self.baselines), None)

    @property
    def baseline(self) -> tuple[dict[str, str], dict[str, str]] | None:
        """The default kind's ``target`` and ``versions`` (what ``/health`` shows)."""
        kind = self.default_kind
        return None if kind is None else self.baselines[kind]

    def _success(self, node: NodeRecord) -> None:
        node.failures = 0
        baseline = self.baselines.setdefault(node.kind, (dict(node.target), dict(node.versions)))
        if (node.target, node.versions) != baseline:
            node.state = INCOMPATIBLE
            node.successes = 0
            return
        if node.state in (STARTING, INCOMPATIBLE, READY, LEFT):  # LEFT: back, restarted
            node.state = READY
            return
        node.successes += 1
        node.state = READY if node.successes >= self.settings.recovery_threshold else RECOVERING

    def _failure(self, node: NodeRecord, now: float) -> None:
        node.successes = 0
        node.failures += 1
        if node.state in (STARTING, RECOVERING) or self._failed_too_long(node, now):
            node.state = UNHEALTHY

    def _failed_too_long(self, node: NodeRecord, now: float) -> bool:
        """Whether a failing node is out (ROUTER §6): ``--unhealthy-threshold`` failing
        statuses in a row, the last of them more than ``--max-status-age-seconds`` after
        its last healthy status, the age a silent node is out at. A supervisor sends its last
        probe's failure again at every health interval while its next probe waits, so one
        slow answer under a short interval made three statuses, and a node whose server was
        busy for a second read ``unhealthy``; it takes no new work from its first failure
        (``NodeRecord.saturated``) all the same."""
        return (
            node.state in (READY, INCOMPATIBLE)
            and node.failures >= self.settings.unhealthy_threshold
            and now - node.healthy_at > self.settings.max_status_age_seconds
        )

    def _lose(self, node: NodeRecord, now: float) -> None:
        self.on_node_lost(node.node_id, "left the router")
        node.connected = False
        node.state = LEFT if node.state == DRAINING else UNHEALTHY
        node.successes = 0
        if node.lost_at is None:
            node.lost_at = now

    def check(self) -> None:
        """Periodic staleness check, saturation expiry and retention (§6)."""
        now = time.monotonic()
        for node in list(self.nodes.values()):
            if node.connected and now - node.last_status_at > self.settings.max_status_age_seconds:
                self._lose(node, now)
            elif node.connected and self._failed_too_long(node, now):
                node.state = UNHEALTHY  # still failing: out at the deadline, not at its next status
        for node in retired(self.nodes.values(), now, self.settings.node_retention_seconds):
            self.forget(node)
        # A kind none of whose node records is left sets a new baseline with its next node.
        kinds = {n.kind for n in self.nodes.values()}
        for kind in [k for k in self.baselines if k not in kinds]:
            del self.baselines[kind]
        self.on_change()

    def forget(self, node: NodeRecord) -> None:
        for slot in list(node.slots.values()):
            slot.close((grpc.StatusCode.UNAVAILABLE, "node forgotten"), "tunnel_disconnected")
        if node.stream is not None:
            node.stream.supersede()
        self.nodes.pop(node.node_id, None)

    def mark_saturated(self, node_id: str) -> None:
        node = self.nodes.get(node_id)
        if node is not None:
            node.saturated_until = time.monotonic() + self.settings.status_check_interval_seconds

    # -- slots -----------------------------------------------------------------------------

    def add_slot(self, slot: RouterSlot) -> tuple[grpc.StatusCode, str] | None:
        """Register a slot; return an error status for the stream instead when refused."""
        node = self._node(slot.node_id)
        refused = slot_refusal(node, slot, self.settings.max_slots_per_node)
        if refused is not None:
            return refused
        if not node.connected and node.lost_at is None:
            node.lost_at = time.monotonic()  # no supervisor yet: retention applies
        node.slots[slot.slot_id] = slot
        self.on_change()
        return None

    def remove_slot(self, slot: RouterSlot) -> None:
        node = self.nodes.get(slot.node_id)
        if node is not None and node.slots.get(slot.slot_id) is slot:
            del node.slots[slot.slot_id]
        self.on_change()

    def release(self, slot: RouterSlot) -> None:
        slot.finish()
        self.on_change()

    def of_default_kind(self, node: NodeRecord) -> bool:
        """Whether ``node`` serves requests without a selector (ROUTER §6)."""
        return node.kind == self.default_kind

    def select(
        self,
        affinity: str | None,
        request_id: str,
        selector: Selector | None = None,
        gpu_count: int | None = None,
    ) -> tuple[NodeRecord, RouterSlot] | None:
        """Pick a node (affinity, then power of two choices) among those ``selector`` and
        ``gpu_count`` allow (an affinity never overrides them) and lease its oldest idle
        slot."""
        now = time.monotonic()
        chosen = None
        if affinity is not None:
            node = self.nodes.get(affinity)
            if node is not None and eligible(node, now, self.default_kind, selector, gpu_count):
                chosen = node
        if chosen is None:
            default = self.default_kind
            candidates = [
                n for n in self.nodes.values() if eligible(n, now, default, selector, gpu_count)
            ]
            if not candidates:
                return None
            pair = random.sample(candidates, 2) if len(candidates) > 1 else candidates
            chosen = min(pair, key=lambda n: (n.load(), n.last_selected))
        slot = min(chosen.idle_slots(), key=lambda s: s.idle_since)
        self._selections += 1
        chosen.last_selected = self._selections
        slot.begin(request_id)
        return chosen, slot

    def control_nodes(self, *, ready_only: bool) -> list[NodeRecord]:
        """Connected nodes that have control slots of their current server instance."""
        return [
            n
            for n in self.nodes.values()
            if n.connected
            and (not ready_only or (n.state == READY and self.of_default_kind(n)))
            and n.current_slots(CONTROL)
        ]

    def select_control(
        self, node_id: str | None, request_id: str, long: LongHold | None = None
    ) -> tuple[NodeRecord, RouterSlot] | None:
        """Lease an idle control slot: of ``node_id`` (any state; a job lives there), or of
        any ``ready`` node (fewest busy control slots first), where ``has_control_room``
        (``long``: a request that holds its slot long, docs/scaling.md)."""
        if node_id is not None:
            node = self.nodes.get(node_id)
            candidates = [node] if node is not None and node.reachable() else []
        else:
            candidates = [
                n
                for n in self.nodes.values()
                if n.state == READY and n.connected and self.of_default_kind(n)
            ]
        candidates = [n for n in candidates if has_control_room(n, long)]
        if not candidates:
            return None
        chosen = min(
            candidates, key=lambda n: len(n.current_slots(CONTROL)) - len(n.idle_slots(CONTROL))
        )
        slot = min(chosen.idle_slots(CONTROL), key=lambda s: s.idle_since)
        slot.begin(request_id, long.holder if long is not None else None)
        return chosen, slot

    # -- health ----------------------------------------------------------------------------

    def capacity(self) -> int:
        """Worker slots of the default kind's ready nodes (``/health`` describes that kind)."""
        now = time.monotonic()
        return sum(
            len(n.current_slots())
            for n in self.nodes.values()
            if n.state == READY and n.connected and not n.saturated(now) and self.of_default_kind(n)
        )

    def any_ready_with_slots(self) -> bool:
        return any(
            n.state == READY and n.connected and n.current_slots() and self.of_default_kind(n)
            for n in self.nodes.values()
        )

    def _node(self, node_id: str) -> NodeRecord:
        node = self.nodes.get(node_id)
        if node is None:
            retention = self.settings.node_retention_seconds
            for old in retired(self.nodes.values(), time.monotonic(), retention, room=1):
                self.forget(old)
            node = self.nodes[node_id] = NodeRecord(node_id)
        return node


def retired(
    nodes: Iterable[NodeRecord], now: float, retention: float, room: int = 0
) -> list[NodeRecord]:
    """The records retention ends (ROUTER §6), of disconnected nodes without a request on
    their slots: each once ``retention`` seconds old, and the oldest beyond
    ``MAX_RETAINED_NODES`` (less ``room``, kept for a record about to be made)."""
    idle = sorted(
        (n for n in nodes if not n.connected and n.lost_at is not None and not n.busy_slots()),
        key=lambda n: n.lost_at or 0.0,
    )
    excess = len(idle) + room - MAX_RETAINED_NODES
    return [n for i, n in enumerate(idle) if i < excess or now - (n.lost_at or now) > retention]
