"""A request's connection is recorded once, for its thread, and read by all that reach it
(``kcoral.connection.request_connection``): a cut from an ``AsyncClient``'s event loop and
the deadline of its answer shut the same connection, the one the keep-alive pool handed
the request's thread. The pool used to set two thread-local records side by side, one for
cuts (``in_flight``) and one for deadlines (``answer_deadline``), each with its own copy
of the connection. A real socket takes the connection and never answers."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest
from stand_in_http import silent
from waiting import wait_until

from kcoral.connection import answer_deadline, http, request_connection
from kcoral.connection.answer_deadline import AnswerDeadline
from kcoral.connection.http import HttpTransport
from kcoral.connection.in_flight import InFlight, running
from kcoral.connection.request_connection import RequestConnection
from kcoral.errors import TransportError


def test_a_requests_cut_and_its_deadline_shut_the_one_connection_its_thread_was_handed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    armed: list[AnswerDeadline] = []

    def watched(at: float, request: RequestConnection) -> AnswerDeadline:
        deadline = answer_deadline.watched(at, request)
        armed.append(deadline)
        return deadline

    monkeypatch.setattr(http, "watched", watched)
    flight = InFlight()
    ended: Future[BaseException | None] = Future()

    with silent() as url:
        transport = HttpTransport(url, headers={}, connect_timeout_seconds=10)

        def status_read() -> None:
            try:
                with running(flight):
                    transport.request("GET", "/v1/health", read_timeout=600)
            except BaseException as error:  # what the cut does to it: asserted below
                ended.set_result(error)
            else:
                ended.set_result(None)
            ended_record.append(request_connection.current())

        ended_record: list[RequestConnection | None] = []
        thread = threading.Thread(target=status_read)
        thread.start()
        assert wait_until(lambda: getattr(flight.record.connection, "sock", None) is not None)
        [deadline] = armed
        assert deadline.request is flight.record  # one record: the cut's is the deadline's
        flight.cut(ended)
        thread.join(timeout=60)
        assert isinstance(ended.result(), TransportError)  # its blocked read ended at the cut
    assert ended_record == [None]  # the thread's record is let go with its request
    assert deadline.ended and not deadline.passed
    assert deadline.request is None


def test_a_request_inside_a_cuttable_call_takes_its_record_and_one_alone_opens_its_own() -> None:
    flight = InFlight()
    with running(flight), request_connection.of_this_thread() as record:
        assert record is flight.record
    with request_connection.of_this_thread() as alone:
        assert alone is request_connection.current()
    assert request_connection.current() is None
