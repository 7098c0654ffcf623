"""A JSON-mode call refusing an argument says what it is in plain words and that pickle mode
sends it (CLIENT_API §8): it read 'is a int64' and 'has a int key', and a NaN's refusal
named no way out."""

from __future__ import annotations

import numpy as np
import pytest

from kcoral.remote import RemoteFunction


def echo(x: object) -> object:
    return x


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (
            np.int64(3),
            TypeError,
            "argument 'x' is of type int64, not a JSON value (None, bool, int, float, str, "
            "list, dict with str keys); use serialization='pickle' for other objects",
        ),
        (
            {1: "a"},
            TypeError,
            "argument 'x' has a key of type int; JSON keys are str "
            "(serialization='pickle' sends it)",
        ),
        (
            float("nan"),
            ValueError,
            "argument 'x' is a non-finite float (nan); JSON cannot carry it "
            "(serialization='pickle' sends it)",
        ),
    ],
)
def test_a_refused_json_argument_reads_as_english_and_names_pickle(
    value: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as caught:
        RemoteFunction(echo, client=None).build_program(value)
    assert str(caught.value) == message
    # and pickle mode sends it
    RemoteFunction(echo, client=None, serialization="pickle").build_program(value)
