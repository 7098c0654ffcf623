"""A remote function that fails in a ``multiprocessing`` worker raises in the parent.

``multiprocessing`` pickles a worker's exception to hand it to the parent. A
``RemoteExecutionError`` was rebuilt from its message alone, as ``Exception`` does, where its
constructor takes the ``ProgramResult``: unpickling it raised ``AttributeError`` in the
pool's result thread, which died, and ``pool.map`` waited for ever. Real server on loopback,
real ``spawn`` pool.
"""

from __future__ import annotations

import multiprocessing
import pickle

import pytest

from kcoral import Client, KCoralError, RemoteExecutionError, TransportError

#: a pool that does not answer is given up after this long (a guard, not a measurement)
HANG_GUARD_SECONDS = 120


def divide(x, y):
    return x / y


def divide_remotely(url: str, x: int, y: int) -> float:
    with Client(url) as client:
        return float(client.function()(divide).remote(x, y))


def test_a_remote_failure_in_a_pool_worker_reaches_the_parent_with_its_result(kcoral_server):
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        answer = pool.starmap_async(divide_remotely, [(kcoral_server.url, 1, 0)])
        with pytest.raises(RemoteExecutionError, match="ZeroDivisionError") as caught:
            answer.get(HANG_GUARD_SECONDS)
    assert caught.value.result.status == "FAILED"
    assert "ZeroDivisionError" in caught.value.remote_traceback


def test_client_errors_keep_their_attributes_through_pickle(kcoral_server):
    with Client(kcoral_server.url) as client:
        with pytest.raises(RemoteExecutionError) as caught:
            client.function()(divide).remote(1, 0)
    copy = pickle.loads(pickle.dumps(caught.value))
    assert (str(copy), copy.result) == (str(caught.value), caught.value.result)

    http_error = pickle.loads(
        pickle.dumps(KCoralError(404, "no", kind="not_found", request_id="r"))
    )
    assert (http_error.status_code, http_error.message, http_error.kind, http_error.request_id) == (
        404,
        "no",
        "not_found",
        "r",
    )
    transport_error = pickle.loads(pickle.dumps(TransportError("gone", url="http://h:1")))
    assert (str(transport_error), transport_error.url) == ("gone", "http://h:1")
