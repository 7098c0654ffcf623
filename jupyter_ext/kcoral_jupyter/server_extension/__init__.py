"""Jupyter server extension: REST handlers under ``{base_url}kcoral/api/``, and the settings
that say which KCoral servers they ask.

Servers come from ``c.KCoralExtension.servers = [{"name": ..., "url": ..., "token": ...}]``;
when none are configured: ``KCORAL_URL`` (with ``KCORAL_TOKEN``) and the embedded servers
that kernels advertise in the runtime directory, each with its own token from its 0600
advertisement (EXTENSIONS §6). Whatever is configured, every server a live kernel says it
uses (``runtime_records.kernel_connections``: its embedded server, or the URL it connected
to) is listed too, with the ids of those kernels in ``kernels``, so that the status bar can
show the server of the notebook in focus. Tokens stay in this process: the browser sees
only names. A configured address that is no server address is listed with its ``error``
(and a warning in the Jupyter server's log), never asked.

Who can reach what: the routes (``routes``) answer only callers the Jupyter server
authenticates, and act with the KCoral tokens configured here (``base_handler``). The
modules, one idea each:

* ``routes``: each route's URL and handler;
* ``base_handler``: what every handler shares: the server list, calls to a KCoral server
  (no redirect followed), JSON errors;
* ``server_status``: ``GET servers``, what each server says of itself;
* ``jobs``: the jobs routes; ``job_events``: a job's live output, relayed on a client of its
  own (``relay_client``);
* ``sessions``: the sessions routes;
* ``upstream_problems``: a server that cannot be asked, in one line of words;
  ``server_labels``: a label per server a person recognises.
"""

from __future__ import annotations

import os
from typing import Any

from tornado.httpclient import AsyncHTTPClient
from traitlets import Dict, Float, Int, List
from traitlets.config import LoggingConfigurable

from kcoral.connection.server_address import server_url
from kcoral_jupyter.local_server import advertised_servers
from kcoral_jupyter.runtime_records import kernel_connections
from kcoral_jupyter.server_extension.routes import handlers
from kcoral_jupyter.server_extension.upstream_problems import address_problem


class KCoralExtension(LoggingConfigurable):
    """Which KCoral servers the Jupyter server shows and proxies."""

    servers = List(
        Dict(),
        help='Servers as [{"name": "gpu", "url": "http://host:8000", "token": "..."}].',
    ).tag(config=True)
    request_timeout = Float(10.0, help="Seconds for one proxied non-streaming call.").tag(
        config=True
    )
    max_event_streams = Int(
        16, help="Job output streams relayed at once; one more is answered 503."
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.open_event_streams = 0  # relays running now (JobEventsHandler)
        self._warned: set[str] = set()
        self._clients: dict[str, AsyncHTTPClient] = {}

    def client_for(self, url: str) -> AsyncHTTPClient:
        """The HTTP client of the calls to the server at ``url``: each server has its own
        connection slots, so a server that accepts connections and never answers holds
        only its own. (One shared client's 10 slots, filled by a hung server's calls from
        a few panels, queued every other server's calls until they timed out: healthy
        servers were shown as 'no answer within 10 s' and the status bar as offline.)"""
        client = self._clients.get(url)
        if client is None:
            client = AsyncHTTPClient(force_instance=True)
            self._clients[url] = client
        return client

    def _forget_clients(self, listed: set[str]) -> None:
        """Close the clients of servers no longer listed (a kernel's embedded server is new
        at each start), so they do not pile up over the Jupyter server's life."""
        for url in [url for url in self._clients if url not in listed]:
            self._clients.pop(url).close()

    def resolved_servers(self) -> list[dict[str, Any]]:
        """The configured servers (else KCORAL_URL and the kernels' embedded servers), plus
        every server a live kernel uses, each with ``kernels``: the ids of those kernels."""
        found = self._configured_or_advertised()
        by_url = {entry["url"]: entry for entry in found}
        connections = kernel_connections()
        # An embedded server belongs to the kernel that started it, even once that kernel
        # has connected elsewhere (its label names that kernel's notebook).
        kernel_of_pid = {r.get("kernel_pid"): str(r["kernel_id"]) for r in connections}
        for listed in found:
            if "owner_pid" in listed:
                owner = kernel_of_pid.get(listed.pop("owner_pid"))
                if owner is not None:
                    listed["owner_kernel"] = owner
        for record in connections:
            url = str(record["url"]).rstrip("/")
            known = by_url.get(url)
            if known is not None:
                entry = known
            else:
                kind = "local" if record.get("embedded") else "kernel"
                entry = {
                    "name": f"{kind}-{str(record['kernel_id'])[:8]}",
                    "url": url,
                    "token": str(record.get("token") or ""),
                    "embedded": bool(record.get("embedded")),
                }
                if record.get("embedded"):
                    entry["owner_kernel"] = str(record["kernel_id"])
                by_url[url] = entry
                found.append(entry)
            entry.setdefault("kernels", []).append(str(record["kernel_id"]))
        self._forget_clients({str(entry["url"]) for entry in found})
        return found

    def configured_servers(self) -> list[dict[str, Any]]:
        """The servers configured as listed: ``c.KCoralExtension.servers``, else the one
        ``KCORAL_URL`` names (with ``KCORAL_TOKEN``), else none."""
        if self.servers:
            found: list[dict[str, Any]] = []
            for index, entry in enumerate(self.servers):
                name = str(entry.get("name") or f"server{index}")
                where = f"c.KCoralExtension.servers[{index}] ({name!r})"
                listed = self._listed(name, entry.get("url"), str(entry.get("token") or ""), where)
                found.append(listed)
            return found
        if os.environ.get("KCORAL_URL", "").strip():
            token = os.environ.get("KCORAL_TOKEN", "")
            return [self._listed("default", os.environ["KCORAL_URL"], token, "KCORAL_URL")]
        return []

    def _configured_or_advertised(self) -> list[dict[str, Any]]:
        found = self.configured_servers()
        if self.servers:
            return found
        for record in advertised_servers():
            found.append(
                {
                    "name": f"local-{record.get('kernel_pid')}",
                    "url": str(record["url"]),
                    "embedded": True,
                    "owner_pid": record.get("kernel_pid"),
                    # The embedded server's own token (never the user's KCORAL_TOKEN).
                    "token": str(record.get("token") or ""),
                }
            )
        return found

    def _listed(self, name: str, address: object, token: str, where: str) -> dict[str, Any]:
        """A configured server as listed: its address as a URL, by the rule every entry point
        shares (``kcoral.connection.server_address``); one the rule refuses keeps its text,
        gets a ``problem`` (the panel's ``error``; it is never asked) and a warning, once."""
        try:
            return {"name": name, "url": server_url(address), "token": token}
        except (TypeError, ValueError) as exc:
            reason: BaseException = exc if address else ValueError("it has no url")
            problem = address_problem(reason, where)
        if problem not in self._warned:
            self._warned.add(problem)
            self.log.warning("KCoral: %s is not used: %s", where, problem)
        return {"name": name, "url": str(address or "")[:200], "token": "", "problem": problem}


def load_server_extension(serverapp: Any) -> None:
    """Add the handlers to the Jupyter server's web application."""
    extension = KCoralExtension(config=serverapp.config, parent=serverapp)
    web_app = serverapp.web_app
    web_app.settings["kcoral_extension"] = extension
    web_app.add_handlers(".*$", handlers(web_app.settings["base_url"]))
    configured = extension.configured_servers()
    serverapp.log.info(
        "KCoral server extension loaded (%s)", servers_at_load(extension, configured)
    )


def servers_at_load(extension: KCoralExtension, configured: list[dict[str, Any]]) -> str:
    """The servers the panel will ask, as the load line says them (``configured``: what
    ``configured_servers`` listed): it said "0 servers" of a server named by ``KCORAL_URL``,
    since it counted ``c.KCoralExtension.servers`` alone."""
    count = len(configured)
    if extension.servers:
        return f"{count} server{'' if count == 1 else 's'}: c.KCoralExtension.servers"
    if configured:
        # As the panel lists it: a token pasted into the address (http://TOKEN@host,
        # ?token=...) was written into the Jupyter server's log as it stood.
        if configured[0].get("problem"):
            return "no server: KCORAL_URL is not a server address (see the warning above)"
        return f"1 server: KCORAL_URL {configured[0]['url']}"
    return "no server configured: the servers kernels use are listed as they start"
