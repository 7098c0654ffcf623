"""Test-only stand-in for the server's router wiring, used until ``kcoral server`` itself
calls ``run_supervisor`` / ``start_tunnel`` (kcoral_server.main belongs to another module).

``python node_standin.py supervisor ARGS`` runs the supervisor with this file as the child;
``python node_standin.py child ARGS`` runs the normal server and opens the slots once it
listens, closing them on shutdown.
"""

from __future__ import annotations

import asyncio
import os
import sys


def wired() -> bool:
    """True once ``kcoral server --router`` is supported by the real entry point."""
    import inspect

    import kcoral_server.main as server_main

    return "not supported by this build" not in inspect.getsource(server_main)


def run_child(argv: list[str]) -> int:
    import kcoral_server.main as server_main
    from kcoral_server.config import parse_server_args
    from kcoral_server.node.http11 import get_json
    from kcoral_server.node.tunnel import start_tunnel

    settings = parse_server_args(argv, os.environ)
    handles = []
    write_ready = server_main._write_ready_file
    shutdown = server_main._shutdown

    def write_ready_file(path, url):  # called right after the server listens
        async def open_slots() -> None:
            port = int(url.rsplit(":", 1)[1])
            _status, body = await get_json("127.0.0.1", port, "/internal/worker-status")
            handles.append(
                await start_tunnel(
                    settings, url, body["worker_count"], None, instance_id=body["instance_id"]
                )
            )
            write_ready(path, url)

        asyncio.get_running_loop().create_task(open_slots())

    async def shutdown_with_tunnel(state, events):
        await asyncio.gather(shutdown(state, events), *(h.close() for h in handles))

    server_main._write_ready_file = write_ready_file
    server_main._shutdown = shutdown_with_tunnel
    return server_main.main(argv)


def run_supervisor(argv: list[str]) -> int:
    from kcoral_server.config import parse_server_args
    from kcoral_server.node import supervisor

    supervisor.Supervisor.child_command = (sys.executable, os.path.abspath(__file__), "child")
    return supervisor.run_supervisor(parse_server_args(argv, os.environ), argv)


if __name__ == "__main__":
    mode, rest = sys.argv[1], sys.argv[2:]
    sys.exit(run_child(rest) if mode == "child" else run_supervisor(rest))
