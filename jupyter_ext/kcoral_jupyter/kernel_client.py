"""``client = %kcoral client``: a ``kcoral.Client`` for whatever server the kernel's cells use.

Notebook code next to ``%%kcoral`` cells wants the same server the cells run on, with its
token: the embedded server's token is made fresh at each start and lives only in this
kernel (``local_server.py``), so ``Client(url)`` built from ``%kcoral url`` is refused with
401, and a client built once would break at the next ``%kcoral local stop``/``start`` or
``%kcoral connect``. This client therefore decides on every request where it goes: it asks
the kernel's state (``KernelState``) for its current URL (``resolve_url``, which also starts
the embedded server when that is the default) and sends the request through the kernel's own
client for that URL, which carries that URL's token (``KernelState.token_for``).

Who can see the token: nobody through this object. It holds no token and no headers with
one; ``repr`` names only the URL. The token stays in the kernel's per-URL clients, as it
did before. No IPython import (the magic hands the kernel state in).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from kcoral import Client
from kcoral.connection.event_stream import EventSource
from kcoral.connection.transport import Flow, Request, Response

if TYPE_CHECKING:
    from kcoral_jupyter.kernel_state import KernelState


def _one_request(request: Request) -> Generator[Request, Response, Response]:
    return (yield request)


class KernelConnectionTransport:
    """Sends each request through the kernel's client for its current URL."""

    def __init__(self, kernel: KernelState) -> None:
        self.kernel = kernel

    def current_client(self) -> Client:
        return self.kernel.client(self.kernel.resolve_url())

    def handle_request(self, request: Request) -> Response:
        return self.current_client().run_flow(_one_request(request))

    def close(self) -> None:
        """Nothing of its own to close: the kernel state owns (and closes) its clients."""


class KernelClient(Client):
    """A ``Client`` that follows the kernel's connection (``%kcoral client``).

    ``base_url`` is read anew each time; requests, job event streams and ``/v1/info`` go to
    the server the kernel's cells use at that moment."""

    def __init__(self, kernel: KernelState) -> None:
        self._connection = KernelConnectionTransport(kernel)
        # token="": never read KCORAL_TOKEN into this object (the kernel's clients hold
        # the right token for each URL; the user's token must not reach the embedded server).
        super().__init__(kernel.resolve_url(), token="", transport=self._connection)

    @property
    def base_url(self) -> str:
        return self._connection.kernel.resolve_url()

    @base_url.setter
    def base_url(self, _value: str) -> None:
        pass  # set by BaseClient's constructor; the kernel's connection decides instead

    def __repr__(self) -> str:
        # Never starts a server: says the URL the kernel uses now, if any.
        used = self._connection.kernel.used_url or "none yet"
        return f"KernelClient(the kernel's connection, now {used!r})"

    def info_flow(self) -> Flow[dict[str, Any]]:
        """``/v1/info`` of the current server (each server's answer cached by its client)."""
        return (yield from self._connection.current_client().info_flow())

    def event_source(
        self, path: str, *, last_event_id: int = 0, read_timeout: float | None = None
    ) -> EventSource:
        """A job's event stream from the current server, with that server's token."""
        return self._connection.current_client().event_source(
            path, last_event_id=last_event_id, read_timeout=read_timeout
        )
