"""What each node listed of its sessions as it connected to a restarted router (ROUTER §13),
kept per node: the table is bounded, and a node that lists more than its share loses its own
oldest entries, never another node's. A rogue node listing 100,000 made-up ids pushed the
real nodes' listings out of one shared table, and an owner's end the router then kept (and
answered 410 "ended for you") waited for a listing that had come already."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class Listing:
    """A session a node listed when it connected (not a binding: see ``SessionIndex.gone``)."""

    node_id: str
    instance_id: str  # the node's server then
    owner: str


class ListingTable:
    """Session id → the nodes that listed it, at most ``capacity`` entries in all. Past it,
    the node with the most entries loses its oldest: a node's listing of up to
    ``capacity`` / (the nodes that list) entries is never pushed out, and the node that lost
    entries is remembered as listed in part (``incomplete``)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._by_node: dict[str, OrderedDict[str, Listing]] = {}
        self._size = 0
        # node id -> the server instance whose listing lost entries here
        self.incomplete: dict[str, str] = {}

    def add(self, session_id: str, listing: Listing) -> None:
        entries = self._by_node.setdefault(listing.node_id, OrderedDict())
        self._size += session_id not in entries
        entries[session_id] = listing
        entries.move_to_end(session_id)
        while self._size > self.capacity:
            largest = max(self._by_node.values(), key=len)
            _dropped, lost = largest.popitem(last=False)
            self._size -= 1
            self.incomplete[lost.node_id] = lost.instance_id

    def of(self, session_id: str) -> list[Listing]:
        """Every node's listing of ``session_id`` (several: all but one of them lie)."""
        found = (entries.get(session_id) for entries in self._by_node.values())
        return [listing for listing in found if listing is not None]

    def sole(self, session_id: str) -> Listing | None:
        """Where ``session_id`` was listed; None: nowhere, or by more than one node."""
        listings = self.of(session_id)
        return listings[0] if len(listings) == 1 else None

    def __len__(self) -> int:
        return self._size
