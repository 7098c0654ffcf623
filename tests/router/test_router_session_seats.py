"""Fair session seats through a router (EXTENSIONS §11, ROUTER §13): a real router with two
real CPU nodes places a session only on a node where the caller is below that node's
per-identity cap, which it reads from the node's ``/v1/info`` asked as the caller."""

from __future__ import annotations

import pytest
from kcoral_server.router.routes.sessions import free_seats, no_seat_message
from router_helpers import Node, ready_nodes, start_router, stopping

import kcoral
from kcoral.errors import KCoralError

pytestmark = pytest.mark.slow
ALICE, BOB = "alice-router-token", "bob-router-token"
NODES_ENV = {"KCORAL_NODE_TOKEN": "routed-node-token"}


def node_of(client: kcoral.Client, session_id: str) -> str:
    return client.request("GET", f"/v1/sessions/{session_id}").headers["X-KCoral-Node"]


def test_placement_skips_a_node_where_the_caller_is_at_its_cap(tmp_path) -> None:
    tokens = tmp_path / "client-tokens"
    tokens.write_text(f"alice {ALICE}\nbob {BOB}\n")
    router = start_router(
        tmp_path,
        "--status-check-interval-seconds",
        "0.3",
        "--auth-token-file",
        str(tokens),
        env=NODES_ENV,
    )
    # n-z has the most free seats but lets one identity hold only one of them; n-a has one.
    capped = ("--max-sessions", "3", "--max-sessions-per-identity", "1")
    nodes = [
        Node(tmp_path, router, "n-z", NODES_ENV, *capped),
        Node(tmp_path, router, "n-a", NODES_ENV, "--max-sessions", "1"),
    ]
    with stopping(router, nodes):
        ready_nodes(router, 2)
        with kcoral.Client(router.url, token=ALICE) as alice:
            first = alice.session()
            assert node_of(alice, first.id) == "n-z"  # a tie (one seat each for alice)
            # n-z still has two free seats, but not for alice: the router sends her to n-a
            second = alice.session()
            assert node_of(alice, second.id) == "n-a"
            with pytest.raises(KCoralError) as refused:
                alice.session()
            assert refused.value.status_code == 503 and refused.value.kind == "busy"
            assert refused.value.message == (
                "no node offers a free session seat: 4 seats on 2 nodes, 2 held, 2 by you; "
                "where seats are free you hold the most one identity may (1): "
                "end one of your sessions"
            )
            with kcoral.Client(router.url, token=BOB) as bob:
                third = bob.session()  # bob still gets one of n-z's seats
                assert node_of(bob, third.id) == "n-z"
                third.close()
            first.close()
            second.close()


@pytest.mark.parametrize(
    ("counts", "free"),
    [
        ({"max": 3, "active": 1}, 2),  # a node from before the cap
        ({"max": 3, "active": 1, "max_per_identity": None, "held_by_you": 1}, 2),
        ({"max": 3, "active": 1, "max_per_identity": 1, "held_by_you": 1}, 0),
        ({"max": 4, "active": 1, "max_per_identity": 2, "held_by_you": 1}, 1),
        ({"max": 2, "active": 2, "max_per_identity": 2, "held_by_you": 0}, 0),
        ({"max": "3", "active": 0, "max_per_identity": True, "held_by_you": "x"}, 0),
    ],
)
def test_a_nodes_free_seats_for_the_caller_are_its_free_seats_within_its_cap(
    counts: dict, free: int
) -> None:
    assert free_seats({"features": ["sessions"], "sessions": counts}) == free


def test_a_fleet_whose_seats_are_all_held_says_so_without_blaming_the_callers_cap() -> None:
    offers = [
        {"max": 2, "active": 2, "max_per_identity": 1, "held_by_you": 0},
        {"max": 1, "active": 1, "max_per_identity": None, "held_by_you": 1},
    ]
    assert no_seat_message(offers) == (
        "no node offers a free session seat: 3 seats on 2 nodes, 3 held, 1 by you"
    )
    assert no_seat_message([]) == "no node offers a free session seat"
    one = [{"max": 1, "active": 1, "max_per_identity": None, "held_by_you": 0}]
    assert no_seat_message(one) == (
        "no node offers a free session seat: 1 seat on 1 node, 1 held, 0 by you"
    )
