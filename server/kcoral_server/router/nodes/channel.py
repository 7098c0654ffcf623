"""A bounded single-producer/single-consumer channel that can be closed with a reason.

Both ends of a slot stream use it between the gRPC reader and the code relaying a body, so
at most ``capacity`` frames sit in memory (backpressure instead of buffering whole bodies).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class ChannelClosed(Exception):
    """Raised by ``get`` once the channel is closed and drained; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Channel(Generic[T]):
    def __init__(self, capacity: int = 2) -> None:
        self._items: deque[T] = deque()
        self._capacity = capacity
        self._getter: asyncio.Future[None] | None = None
        self._putter: asyncio.Future[None] | None = None
        self.closed_reason: str | None = None
        self._drain = False  # closed without discarding: get() hands out what is left first

    async def put(self, item: T) -> bool:
        """Wait for room and append; return False (dropping the item) if closed."""
        while len(self._items) >= self._capacity and self.closed_reason is None:
            self._putter = asyncio.get_running_loop().create_future()
            await self._putter
        if self.closed_reason is not None:
            return False
        self._items.append(item)
        self._wake("_getter")
        return True

    async def get(self) -> T:
        """Next item; after ``close`` the remaining items are discarded (unless it was closed
        with ``discard=False``: they come first) and this raises."""
        while not self._items:
            if self.closed_reason is not None:
                raise ChannelClosed(self.closed_reason)
            self._getter = asyncio.get_running_loop().create_future()
            await self._getter
        if self.closed_reason is not None and not self._drain:
            raise ChannelClosed(self.closed_reason)
        item = self._items.popleft()
        self._wake("_putter")
        return item

    def close(self, reason: str, *, discard: bool = True) -> None:
        """No more puts; ``discard=False`` lets the consumer take the items already in (the
        first close decides)."""
        if self.closed_reason is not None:
            return
        self.closed_reason = reason
        self._drain = not discard
        if discard:
            self._items.clear()
        self._wake("_getter")
        self._wake("_putter")

    def _wake(self, attribute: str) -> None:
        waiter = getattr(self, attribute)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        setattr(self, attribute, None)
