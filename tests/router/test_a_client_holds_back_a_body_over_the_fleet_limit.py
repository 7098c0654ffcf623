"""A client holds a large body to a router's ``fleet_limits.max_request_bytes`` (ROUTER §13,
CLIENT_API §2.1 step 11): the largest body the router passes on that some ready node may take.
Before, a client skipped the check for a router (its ``limits`` are one node's), and a 9 MiB
body went out in full to a fleet whose only node takes 1 MiB, to be answered 413. A real
router with a real CPU node of a 1 MiB limit; the client's real HTTP transport records what
it is handed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from recording_transport import Recording, program_of
from router_helpers import RouterProcess, router_with_a_node

import kcoral
from kcoral.connection.http import HttpTransport
from kcoral.connection.request_limit import ASK_FROM_BYTES, RequestTooLarge

TOKEN = "fleet-limit-client-token"
NODE_ENV = {"KCORAL_NODE_TOKEN": "fleet-limit-node-token"}


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    tmp = tmp_path_factory.mktemp("fleet-limit-client")
    with router_with_a_node(
        tmp, f"alice {TOKEN}\n", NODE_ENV, "--max-request-bytes", "1M", node_id="small"
    ) as router:
        yield router


@pytest.mark.slow
def test_a_body_over_what_any_ready_node_takes_is_not_sent_through_a_router(
    router: RouterProcess,
) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    transport = Recording(HttpTransport(router.url, headers=headers, connect_timeout_seconds=10))
    with kcoral.Client(router.url, transport=transport) as client:
        with pytest.raises(RequestTooLarge) as refused:
            client.execute(
                program_of(ASK_FROM_BYTES + 4096, bytes(ASK_FROM_BYTES + 4096)), timeout_seconds=30
            )
        sent_large = [request for request in transport.sent if request[2] > 1 << 20]
        # a body the node takes still goes, and runs
        assert (
            client.execute(program_of(4096, bytes(4096)), timeout_seconds=30).results["size"]
            == 4096
        )
    assert sent_large == []
    assert (refused.value.status_code, refused.value.kind) == (413, "request_too_large")
    message = str(refused.value)
    assert message.startswith("request not sent: its body of 8.0 MiB ("), message
    assert message.endswith(
        "is over the largest limit of the router's ready nodes, 1.0 MiB (1048576 bytes; "
        "kcoral server --max-request-bytes on the nodes)"
    ), message
