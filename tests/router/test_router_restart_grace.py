"""A router that just restarted knows no job: it answers an id that no connected node knows
with 503 while its nodes may still be reconnecting (ROUTER §13, ``--reconnect-grace-seconds``),
and a client watching a job's events asks again on it. Before, the restart's 404 made
``kcoral run`` give up a job that went on running, unwatched (jobs soak). A real router,
killed and started again on its port under a real CPU node and a job streaming through it,
or a session holding state on it."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from router_helpers import Node, RouterProcess, ready_nodes, start_router, stopping
from server_process import client_token_file

import kcoral
from kcoral.client_sessions import record_flow

pytestmark = pytest.mark.slow

TOKEN = "restart-grace-client-token"
NODE_ENV = {"KCORAL_NODE_TOKEN": "restart-grace-node-token"}
UNKNOWN_JOB = "0c8f7a4e-4d7e-4a51-9d55-000000000000"

SLOW_PRINTS = """
import time

def main(count):
    for index in range(count):
        print(f"line {index}", flush=True)
        time.sleep(0.25)
    return count
"""


def slow_prints(count: int) -> kcoral.Program:
    program = kcoral.Program()
    module = program.upload(kind="module", source=SLOW_PRINTS)
    done = program.run(fn=program.get_function(module=module, name="main"), args=[count])
    program.return_(key="count", value=done)
    return program


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def router_on(tmp_path: Path, port: int) -> RouterProcess:
    """A router as the README starts one: client tokens, its default restart grace."""
    tokens = client_token_file(tmp_path, f"alice {TOKEN}\n")
    args = ("--port", str(port), "--auth-token-file", str(tokens))
    return start_router(tmp_path, *args, env=NODE_ENV)


def test_a_job_watched_through_a_restarting_router_streams_to_its_end(tmp_path: Path) -> None:
    port = free_port()
    routers = [router_on(tmp_path, port)]
    node = Node(tmp_path, routers[0], "only", NODE_ENV)
    with stopping(routers[0], [node]):
        try:
            ready_nodes(routers[0], 1)
            with kcoral.Client(routers[0].url, token=TOKEN) as client:
                job = client.submit(slow_prints(40), timeout_seconds=60)
                printed = ""
                for event in job.events():
                    if event.kind == "stdout":
                        printed += event.data["text"]
                        if len(routers) == 1 and "line 3" in printed:
                            routers[0].process.kill()  # the client's stream breaks here
                            routers[0].process.wait()
                            routers.append(router_on(tmp_path, port))
                assert event.finished and event.data["status"] == "COMPLETED"
                assert printed.splitlines() == [f"line {index}" for index in range(40)]
                assert job.result()["count"] == 40
        finally:  # the restarted router too, however the block ends
            for later in routers[1:]:
                later.stop()
    assert len(routers) == 2


def test_an_unknown_job_id_right_after_a_start_is_503_not_yet_404(tmp_path: Path) -> None:
    router = router_on(tmp_path, free_port())
    node = Node(tmp_path, router, "only", NODE_ENV)
    with stopping(router, [node]):
        ready_nodes(router, 1)
        with kcoral.Client(router.url, token=TOKEN) as client:
            with pytest.raises(kcoral.KCoralError) as early:
                client.job(UNKNOWN_JOB).status()
    assert (early.value.status_code, early.value.kind) == (503, "no_node")
    assert early.value.message.startswith("job not found yet: the router started ")
    # the node is back and answered that it does not hold the job: "may not have
    # reconnected" was untrue of it (as of a session's, ROUTER §13)
    assert early.value.message.endswith(
        " s ago, and the node back since does not hold it: its node has not reconnected yet,"
        " or restarted and lost it"
    )


REMEMBER = """
import kcoral

def main(value):
    kcoral.session.namespace["value"] = value
    return kcoral.session.namespace["value"]
"""

RECALL = """
import kcoral

def main():
    return kcoral.session.namespace["value"]
"""


def known_again(client: kcoral.Client, session_id: str) -> None:
    """Wait until the restarted router finds ``session_id`` on its node (a hang guard, not a
    timing check). The node is ready once its worker slots are back; a look-up asks only
    nodes whose control slots are back too, and until they are it answers 503 "session not
    found yet" (ROUTER §13), as it should: the session's program met that once under load."""
    for _ in range(1200):
        try:
            client.attach_session(session_id)
            return
        except kcoral.KCoralError as error:
            if error.status_code != 503:
                raise
        time.sleep(0.05)
    raise AssertionError(f"the restarted router never found session {session_id}")


def session_call(source: str, *args: object) -> kcoral.Program:
    program = kcoral.Program()
    module = program.upload(kind="module", source=source)
    done = program.run(fn=program.get_function(module=module, name="main"), args=list(args))
    program.return_(key="value", value=done)
    return program


@contextmanager
def a_session_on_one_node(
    tmp_path: Path, *node_args: str
) -> Iterator[tuple[RouterProcess, Node, kcoral.Client, kcoral.Session]]:
    """A router on a free port (to be restarted there), a real CPU node ``only`` (started with
    ``node_args`` too) and a session of alice's on it that holds 41; the node and the router
    stopped afterwards."""
    router = router_on(tmp_path, free_port())
    node = Node(tmp_path, router, "only", NODE_ENV, *node_args)
    with stopping(router, [node]):
        ready_nodes(router, 1)
        with kcoral.Client(router.url, token=TOKEN) as client:
            session = client.session()
            assert session.execute(session_call(REMEMBER, 41))["value"] == 41
            yield router, node, client, session


def test_a_session_keeps_its_state_through_a_restarting_router(tmp_path: Path) -> None:
    with a_session_on_one_node(tmp_path) as (router, _node, client, session):
        router.process.kill()
        router.process.wait()
        restarted = router_on(tmp_path, router.port)
        with stopping(restarted, []):  # stopped however the block ends
            with pytest.raises(kcoral.KCoralError) as early:  # inside the grace: not 404
                # the router's own answer: attach_session would ask again (EXTENSIONS §11)
                client.run_flow(record_flow(UNKNOWN_JOB))
            ready_nodes(restarted, 1)
            known_again(client, session.id)
            assert session.execute(session_call(RECALL))["value"] == 41
            session.close()
    assert (early.value.status_code, early.value.kind) == (503, "no_node")
    assert early.value.message.startswith("session not found yet: the router started ")
