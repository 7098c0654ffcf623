"""Which node holds which job, and for whom (EXTENSIONS §5 through the router): the router learns it
from 202 answers, merged lists and look-ups, and forgets the oldest first."""

from __future__ import annotations

from collections import OrderedDict, defaultdict

from kcoral_server.front_door.callers import Identity
from kcoral_server.router.nodes.registry import SERVER_RESTARTED


class JobIndex:
    """Job id → node id and owner, learned from 202 answers, merged lists and look-ups
    (bounded), and whether the node has run a new server since (the job went with the old)."""

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        # job id → (node id, owner, the node's new servers when the job was bound to it)
        self._nodes: OrderedDict[str, tuple[str, str, int]] = OrderedDict()
        self._servers: defaultdict[str, int] = defaultdict(int)  # node id → new servers run

    def node_lost(self, node_id: str, why: str) -> None:  # Registry.on_node_lost
        if why == SERVER_RESTARTED and node_id in self._servers:  # a node that took jobs:
            self._servers[node_id] += 1  # none of them went to its new server

    def lost(self, job_id: str, node_id: str | None) -> bool:  # with a server node_id replaced
        known = self._nodes.get(job_id)
        return known is not None and known[0] == node_id and known[2] != self._servers[known[0]]

    def remember(self, job_id: str, node_id: str, owner: str) -> bool:
        """Bind ``job_id`` to ``node_id``; False when another node holds it already: a job
        lives on one node, and a rogue node that claims another's job id (in its list or a
        look-up) must not get that job's reads and cancels with its owner's identity."""
        known = self._nodes.get(job_id)
        if known is not None and known[0] != node_id:
            return False
        self._nodes[job_id] = (node_id, owner, self._servers[node_id])
        self._nodes.move_to_end(job_id)
        while len(self._nodes) > self.capacity:
            self._nodes.popitem(last=False)
        return True

    def forget(self, job_id: str) -> None:
        """Unbind ``job_id`` (its node said it does not hold it, ``JobHandler._disowned``)."""
        self._nodes.pop(job_id, None)

    def node_of(self, job_id: str) -> str | None:
        known = self._nodes.get(job_id)
        return known[0] if known is not None else None

    def owner_of(self, job_id: str) -> str | None:
        known = self._nodes.get(job_id)
        return known[1] if known is not None else None

    def visible_to(self, job_id: str, identity: Identity) -> bool:
        """Whether ``identity`` may learn anything of the bound ``job_id``: its owner or an
        admin (EXTENSIONS §5). The router answers for a job itself while its node is away
        (503 ``node_gone``), and another identity must get an unknown id's answer there."""
        known = self._nodes.get(job_id)
        return known is not None and identity.owns(known[1])

    def __len__(self) -> int:
        return len(self._nodes)
