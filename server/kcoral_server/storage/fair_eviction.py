"""Which entries a shared byte bound drops, fairly between the identities that hold them.

Every bound the server keeps for all identities together (finished jobs under
``--job-retention-bytes``, the disk cache under ``--disk-cache-capacity-mbytes``, the memory
cache) would, dropping the oldest entry first whoever holds it, let another token holder
flush everyone else's entries by storing a lot of its own. So over the bound the owner
holding the most bytes gives up its oldest entry, until the rest fit: a flood drops the
flooder's own entries first, and one owner alone sees plain oldest-first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import TypeVar

Entry = TypeVar("Entry")


def fair_victims(
    entries: Iterable[Entry],
    budget: int,
    *,
    owner: Callable[[Entry], str],
    size: Callable[[Entry], int],
) -> list[Entry]:
    """The entries to drop so that the rest fit ``budget``, in the order to drop them.

    ``entries`` come oldest first; each round the owner holding the most bytes (ties: the
    one whose name sorts first, so the answer does not depend on dict order) gives up its
    oldest."""
    queues: dict[str, deque[Entry]] = {}
    held: dict[str, int] = {}
    total = 0
    for entry in entries:
        name, bytes_ = owner(entry), size(entry)
        queues.setdefault(name, deque()).append(entry)
        held[name] = held.get(name, 0) + bytes_
        total += bytes_
    victims: list[Entry] = []
    while total > budget and held:
        name = max(sorted(held), key=held.__getitem__)
        entry = queues[name].popleft()
        bytes_ = size(entry)
        held[name] -= bytes_
        total -= bytes_
        if not queues[name]:
            del held[name]
        victims.append(entry)
    return victims
