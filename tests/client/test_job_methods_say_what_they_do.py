"""Every public member of ``Job`` and ``AsyncJob`` says what it does: ``help(job)`` and an
editor's hover show it (``AsyncJob.status`` and ``AsyncJob.cancel`` said nothing)."""

from __future__ import annotations

import inspect

import pytest

from kcoral.jobs import AsyncJob, Job


def public_members(cls: type) -> dict[str, object]:
    """The public methods and properties of ``cls``, its bases' included (``object``'s not)."""
    found: dict[str, object] = {}
    for klass in reversed(cls.__mro__[:-1]):
        for name, member in vars(klass).items():
            if not name.startswith("_") and (callable(member) or isinstance(member, property)):
                found[name] = member
    return found


@pytest.mark.parametrize("cls", [Job, AsyncJob], ids=lambda cls: cls.__name__)
def test_every_public_member_of_a_job_handle_has_a_docstring(cls: type) -> None:
    undocumented = [
        f"{cls.__name__}.{name}"
        for name, member in public_members(cls).items()
        if not (member.__doc__ or "").strip()
    ]
    assert undocumented == []
    assert {"status", "cancel", "events", "result", "wait"} <= set(public_members(cls))


def test_the_async_jobs_status_and_cancel_say_which_request_they_send() -> None:
    assert "GET /v1/jobs/{id}" in (inspect.getdoc(AsyncJob.status) or "")
    assert "DELETE /v1/jobs/{id}" in (inspect.getdoc(AsyncJob.cancel) or "")
