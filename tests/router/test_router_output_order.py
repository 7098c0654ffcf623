"""Through a router, a program's stdout and stderr keep the order the program wrote them
(EXTENSIONS §16): the router passes the client's ``X-KCoral-Output-Order`` to the node and
the node's ``output_order`` back, for ``/execute`` and for a job's events and result. A real
router with client tokens and one real CPU node."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from live_output_order import follow, in_order_written, live_program
from router_helpers import RouterProcess, router_with_a_node

import kcoral

pytestmark = pytest.mark.slow

TOKEN = "output-order-client-token"
NODE_ENV = {"KCORAL_NODE_TOKEN": "output-order-node-token"}
SOURCE = """
import sys

def interleaved():
    print("a")
    print("warn", file=sys.stderr)
    print("b")
    return 1
"""
IN_ORDER = [("stdout", "a\n"), ("stderr", "warn\n"), ("stdout", "b\n")]


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    tmp = tmp_path_factory.mktemp("output-order")
    with router_with_a_node(tmp, f"alice {TOKEN}\n", NODE_ENV) as router:
        yield router


def interleaved() -> kcoral.Program:
    program = kcoral.Program()
    module = program.upload(kind="module", source=SOURCE)
    program.run(fn=program.get_function(module=module, name="interleaved"))
    return program


def test_an_execute_through_a_router_comes_back_in_the_order_written(
    router: RouterProcess,
) -> None:
    with kcoral.Client(router.url, token=TOKEN) as client:
        assert client.execute(interleaved()).output_in_order() == IN_ORDER


def test_a_jobs_events_through_a_router_come_in_the_order_written(router: RouterProcess) -> None:
    with kcoral.Client(router.url, token=TOKEN) as client:
        job = client.submit(interleaved())
        events = []
        for event in job.events():
            if event.kind in ("stdout", "stderr"):
                events.append((event.kind, event.text))
            if event.kind == "phase" and event.finished:
                break
        assert events == IN_ORDER
        assert job.result().output_in_order() == IN_ORDER


def test_a_job_followed_live_through_a_router_shows_one_calls_output_in_the_order_written(
    router: RouterProcess, tmp_path: Path
) -> None:
    # out, err, out again within one call, each turn seen live before the program goes on:
    # the node's polls send them in that order and the router passes the events on as sent
    with kcoral.Client(router.url, token=TOKEN) as client:
        job = client.submit(live_program(tmp_path))
        pieces = follow(job, tmp_path)
        result = job.result()
    assert "never saw" not in result.stdout
    assert pieces == in_order_written() == result.output_in_order()
