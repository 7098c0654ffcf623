"""``GET servers``: each KCoral server the extension knows, with what it says of itself.

Each server is asked ``/health`` and ``/v1/info`` (both at once, every server at once; the
answer to ``/v1/info`` is not awaited once ``/health`` failed);
the answer lists it with ``kernels``: the ids of the live kernels that use it, and
``notebooks``: their notebooks. A server that cannot be asked is described in one line of
words (``upstream_problems``), and each gets a ``label`` (``server_labels``): its
configured name, "local server of NOTEBOOK", or its URL. Only what the server sent as a JSON
object is passed on; its token never is (``auth`` says whether one is configured).

Who can reach it: callers the Jupyter server authenticates (``base_handler``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import tornado.web

from kcoral_jupyter.server_extension.base_handler import KCoralHandler
from kcoral_jupyter.server_extension.server_labels import notebooks_of, server_label
from kcoral_jupyter.server_extension.upstream_problems import refusal_problem

#: questions whose answers are no longer awaited, held until they end (the event loop keeps
#: only weak references to its tasks)
_left_to_end: set[asyncio.Future[Any]] = set()


class ServersHandler(KCoralHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        servers = self.servers()
        paths = await self.notebook_paths()

        async def describe(server: dict[str, Any]) -> dict[str, Any]:
            asking_info = asyncio.ensure_future(self.upstream(server, "GET", "/v1/info"))
            h_status, health, h_error = await self.upstream(server, "GET", "/health")
            if h_status == 200:
                i_status, info, i_error = await asking_info
            else:
                # The card says the health problem, and nothing of the info: a router with
                # no ready node says 503 at once but relays /v1/info to a node that may
                # never answer, and waiting for it held every server's card and the status
                # bar at their last answer for the whole request timeout. The question is
                # left to end by itself (``upstream`` never raises): cancelled, the HTTP
                # client logged `Exception after Future was cancelled` at ERROR each poll
                # for a server that refuses connections.
                _left_to_end.add(asking_info)
                asking_info.add_done_callback(_left_to_end.discard)
                i_status, info, i_error = 0, None, ""
            # What the server sent, used only as the object the panel reads.
            health_ok = h_status == 200 and isinstance(health, dict)
            info_ok = i_status == 200 and isinstance(info, dict)
            features = info.get("features") if info_ok else None
            notebooks = notebooks_of(server.get("kernels", []), paths)
            owners = notebooks_of([server.get("owner_kernel", "")], paths)
            entry: dict[str, Any] = {
                "name": server["name"],
                "label": server_label(server, owners),
                "notebooks": notebooks,
                "url": server["url"],
                "auth": bool(server.get("token")),
                "health": health if health_ok else None,
                "info": info if info_ok else None,
                "features": [f for f in features if isinstance(f, str)]
                if isinstance(features, list)
                else [],
                "reachable": h_status != 0,
                "kernels": list(server.get("kernels", [])),
            }
            if h_status != 200:
                entry["error"] = h_error or refusal_problem(
                    h_status, health, bool(server.get("token"))
                )
            elif not health_ok:
                entry["error"] = "answered /health with something other than a JSON object"
            elif i_status in (401, 403):
                # /health answers anyone (PROTOCOL §12); the token is judged from here on,
                # and every cell, job and session would be refused the same way.
                entry["error"] = refusal_problem(i_status, info, bool(server.get("token")))
            elif i_error:  # a redirect, an answer without a body, no answer
                entry["error"] = f"/v1/info: {i_error}"
            elif i_status == 200 and not info_ok:
                entry["error"] = "answered /v1/info with something other than a JSON object"
            return entry

        described = await asyncio.gather(*(describe(s) for s in servers))
        self.write_json(200, {"servers": list(described)})
