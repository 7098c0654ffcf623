"""What a restarted router believes of the sessions its nodes list, and whose ends it carries
out (``routes/session_index.py``, ROUTER §13): the decisions behind
``test_a_session_gone_while_the_router_restarted.py``, with the attacks they turn away."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace

import pytest
from kcoral_server.front_door.callers import Identity
from kcoral_server.router.forwarding.headers import identity_header
from kcoral_server.router.routes import session_index
from kcoral_server.router.routes.session_index import (
    MAX_CLOSERS,
    MAX_KEPT_ENDS,
    SessionIndex,
    SessionInventory,
)
from kcoral_server.router.routes.session_listings import Listing

SESSION = "0c8f7a4e-4d7e-4a51-9d55-0000000000aa"
ALICE, BOB, ADMIN = Identity("alice"), Identity("bob"), Identity("root", admin=True)


def test_a_listed_session_is_gone_only_for_its_owner_and_where_it_was_listed() -> None:
    index = SessionIndex()
    index.listed(SESSION, Listing("n1", "server-1", "alice"))
    assert index.gone(SESSION, ALICE, {"n1"}) == Listing("n1", "server-1", "alice")
    assert index.gone(SESSION, ADMIN, {"n1"}) is not None
    # another identity learns nothing: its answer stays an unknown id's
    assert index.gone(SESSION, BOB, {"n1"}) is None
    # the node that listed it has not answered (not back yet): not known gone
    assert index.gone(SESSION, ALICE, {"n2"}) is None
    assert index.get(SESSION) is None  # a listing binds nothing


def test_an_id_two_nodes_list_is_believed_of_neither() -> None:
    # a rogue node that learnt a session id lists it too: neither listing is believed, so
    # the rogue cannot make the router end the session for its owner
    index = SessionIndex()
    index.listed(SESSION, Listing("n1", "server-1", "alice"))
    index.listed(SESSION, Listing("rogue", "server-9", "alice"))
    index.listed(SESSION, Listing("n1", "server-1", "alice"))
    assert index.gone(SESSION, ALICE, {"n1", "rogue"}) is None


def test_another_identitys_end_of_a_session_is_never_carried_out_for_it() -> None:
    index = SessionIndex()
    index.close_later(SESSION, BOB)  # a token holder who learnt the id ends it first
    for number in range(MAX_CLOSERS):
        index.close_later(SESSION, Identity(f"stranger{number}"))
    # past the kept callers: too late to be kept, and told so (asked again, not 410)
    assert index.close_later(SESSION, ALICE) is False
    assert index.take_close(SESSION, "alice") is None
    index = SessionIndex()
    index.close_later(SESSION, ALICE)
    index.close_later(SESSION, BOB)
    assert index.take_close(SESSION, "alice") == ALICE  # in alice's name, not bob's
    assert index.take_close(SESSION, "bob") is None  # never in hers to a node naming bob
    index = SessionIndex()
    index.close_later(SESSION, ADMIN)
    assert index.take_close(SESSION, "alice") == ADMIN


def test_a_rogue_node_listing_a_kept_end_first_does_not_take_it_from_the_sessions_node() -> None:
    # A rogue node that learnt the id lists it before the session's node is back: under the
    # owner it names, or under alice's, the end kept for alice still reaches her node.
    index = SessionIndex()
    index.close_later(SESSION, ALICE)
    assert index.take_close(SESSION, "mallory") is None  # it named another owner: kept
    assert index.take_close(SESSION, "alice") == ALICE  # it named alice: carried out there
    assert index.take_close(SESSION, "alice") == ALICE  # and again where her node lists it


def test_an_end_kept_for_a_session_bound_before_its_node_listed_it_is_still_carried_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # alice's end came while no node knew the session (answered 410 "ended for you"); the
    # node reconnected, and a request of hers (a merged list, a retried read) bound the
    # session before the node's listing came back. The listing skipped a bound session, so
    # the end kept for it was never sent and the session ran on until its idle timeout.
    sent: list[tuple[str, str, str, list[tuple[bytes, bytes]]]] = []

    async def node_answers(
        state: object, node_id: str, method: str, path: str, headers: list[tuple[bytes, bytes]]
    ) -> tuple[int, bytes]:
        sent.append((node_id, method, path, headers))
        if method == "GET":
            return 200, json.dumps([{"session_id": SESSION, "owner": "alice"}]).encode()
        return 200, b"{}"

    monkeypatch.setattr(session_index, "fetch", node_answers)
    state = SimpleNamespace(
        sessions=SessionIndex(), log=SimpleNamespace(event=lambda *a, **k: None)
    )
    state.sessions.close_later(SESSION, ALICE)
    state.sessions.remember(SESSION, "n1", "server-1", "alice")
    asyncio.run(SessionInventory(state)._list("n1", "server-1"))
    ends = [(node, path, headers) for node, method, path, headers in sent if method == "DELETE"]
    alice = identity_header(ALICE)
    assert ends == [("n1", f"/v1/sessions/{SESSION}", [(alice.name, alice.value)])]


def test_a_token_holders_ends_of_made_up_ids_do_not_push_out_anothers_kept_end() -> None:
    # Right after a router restart, before any node is back, a DELETE of any id is cheap and
    # kept. Mallory ended more made-up ids than the table holds: alice's end, answered 410
    # "session ended for you", fell out of it and her session ran on to its idle timeout.
    index = SessionIndex(capacity=2 * MAX_KEPT_ENDS)
    index.close_later(SESSION, ALICE)
    mallory = Identity("mallory")
    kept = [
        index.close_later(f"{number:08x}-0000-4000-8000-000000000000", mallory)
        for number in range(3 * MAX_KEPT_ENDS)
    ]
    assert index.take_close(SESSION, "alice") == ALICE
    assert kept.count(True) == MAX_KEPT_ENDS  # the rest asked again, never told ended
    # a kept end carried out makes room for another
    assert index.take_close("00000000-0000-4000-8000-000000000000", "mallory") == mallory
    assert index.close_later("ffffffff-0000-4000-8000-000000000000", mallory) is True


def test_a_node_that_answers_its_listing_without_a_list_is_not_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A server without sessions answers 404; asked again at every registry check of the
    # grace, each ask took one of the node's control slots and a place in the router's
    # waiting room, which the waiting-room shares of its clients then lacked (CI).
    asked: list[str] = []

    async def node_answers(state: object, node_id: str, *_args: object) -> tuple[int, bytes]:
        asked.append(node_id)
        return 404, b'{"status": "ERROR"}'

    monkeypatch.setattr(session_index, "fetch", node_answers)
    slots = lambda kind: 2  # noqa: E731 - two control slots connected
    node = SimpleNamespace(connected=True, server_instance_id="server-1", current_slots=slots)
    state = SimpleNamespace(
        sessions=SessionIndex(),
        log=SimpleNamespace(event=lambda *a, **k: None),
        registry=SimpleNamespace(nodes={"n1": node}),
        started_monotonic=time.monotonic(),
        settings=SimpleNamespace(reconnect_grace_seconds=40.0),
    )

    async def three_checks() -> None:
        inventory = SessionInventory(state)
        for _ in range(3):
            inventory.check_nodes()
            await asyncio.sleep(0.01)

    asyncio.run(three_checks())
    assert asked == ["n1"]


def test_a_nodes_flood_of_listed_ids_never_pushes_out_another_nodes_listing() -> None:
    # A rogue node lists more made-up ids than the table holds after alice's node listed
    # her session: her node's listing fell out, and the router said "not found yet" (and
    # kept an end that was never carried out) where it knew better.
    index = SessionIndex(capacity=100)
    index.listed(SESSION, Listing("n1", "server-1", "alice"))
    for number in range(1000):
        made_up = f"{number:08x}-0000-4000-8000-000000000000"
        index.listed(made_up, Listing("rogue", "server-9", "mallory"))
    assert index.gone(SESSION, ALICE, {"n1"}) == Listing("n1", "server-1", "alice")
    assert len(index.listings) == 100
    # the flood lost its own entries: the router knows its listing is not whole
    assert index.listings.incomplete == {"rogue": "server-9"}


def test_an_end_is_kept_while_a_node_whose_listing_lost_entries_is_connected() -> None:
    # That node listed more than its share (a rogue's flood): while it stayed connected,
    # no end was kept in the whole grace. Such an end is now kept, for the node that lists
    # it later, and sent at once to that node (end_where_listed_in_part; the real router
    # and node: tests/router/test_a_rogue_node_beside_a_real_one.py).
    index = SessionIndex(capacity=10)
    for number in range(20):
        index.listed(f"{number:08x}-0000-4000-8000-000000000000", Listing("n1", "s1", "bob"))
    node = SimpleNamespace(connected=True, server_instance_id="s1")
    state = SimpleNamespace(sessions=index, registry=SimpleNamespace(nodes={"n1": node}))
    inventory = SessionInventory(state)
    assert index.listings.incomplete == {"n1": "s1"}
    assert not inventory.listed_already(SESSION, ALICE)


def test_an_end_is_not_kept_where_two_connected_nodes_list_the_session() -> None:
    # A rogue node that learnt alice's id lists it too: the id is believed of neither node,
    # but her node listed it and lists no more, so an end kept for a listing is not kept.
    index = SessionIndex()
    index.listed(SESSION, Listing("n1", "s1", "alice"))
    index.listed(SESSION, Listing("rogue", "s9", "alice"))
    nodes = {
        "n1": SimpleNamespace(connected=True, server_instance_id="s1"),
        "rogue": SimpleNamespace(connected=False, server_instance_id="s9"),
    }
    inventory = SessionInventory(
        SimpleNamespace(sessions=index, registry=SimpleNamespace(nodes=nodes))
    )
    assert inventory.listed_already(SESSION, ALICE)
    assert not inventory.listed_already(SESSION, BOB)  # another identity's: as an unknown id


def test_an_end_is_not_kept_once_the_table_of_ends_is_full() -> None:
    # Many identities' ends of made-up ids filled the table: pushing the oldest out dropped
    # an end already answered 410 "ended for you". The newest is told to ask again instead.
    index = SessionIndex(capacity=3)
    for number in range(3):
        assert index.close_later(
            f"{number:08x}-0000-4000-8000-000000000000", Identity(f"u{number}")
        )
    assert index.close_later(SESSION, ALICE) is False
    assert index.take_close("00000000-0000-4000-8000-000000000000", "u0") == Identity("u0")
    assert index.close_later(SESSION, ALICE) is True


def test_a_rogue_listing_a_session_bound_to_its_node_does_not_take_it_from_there() -> None:
    # A node's word for an id another connected node listed is believed of neither (ids are
    # fresh UUIDs), but a session bound to its node already stays its: a rogue that learnt
    # bob's id and listed it would hide his session from his own list.
    index = SessionIndex()
    index.listed(SESSION, Listing("rogue", "s9", "bob"))
    nodes = {
        name: SimpleNamespace(connected=True, server_instance_id=instance)
        for name, instance in (("n1", "s1"), ("rogue", "s9"))
    }
    inventory = SessionInventory(
        SimpleNamespace(sessions=index, registry=SimpleNamespace(nodes=nodes))
    )
    assert inventory.listed_elsewhere(SESSION, "n1")  # unbound: the two nodes' words clash
    assert not inventory.listed_elsewhere(SESSION, "rogue")  # its own listing
    index.remember(SESSION, "n1", "s1", "bob")
    assert not inventory.listed_elsewhere(SESSION, "n1")
    nodes["rogue"].connected = False
    index = SessionIndex()
    index.listed(SESSION, Listing("rogue", "s9", "bob"))
    inventory.state.sessions = index
    assert not inventory.listed_elsewhere(SESSION, "n1")  # a lister gone says nothing now
