"""``execute``/``submit`` with a non-finite ``timeout_seconds`` name the option (CLIENT_API
§2.1 step 2: ``ValueError``). It read ``cannot encode the request: Out of range float
values are not JSON compliant``, which said neither which option nor what to pass. The
check comes before any request, so the address needs no server."""

from __future__ import annotations

import math

import pytest

import kcoral


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_timeout_is_refused_naming_it(value: float) -> None:
    with kcoral.Client("127.0.0.1:9") as client:
        for call in (client.execute, client.submit):
            with pytest.raises(ValueError) as refused:
                call(kcoral.Program(), timeout_seconds=value)
            assert str(refused.value) == f"timeout_seconds must be a finite number, not {value!r}"
