"""A ``%%kcoral --gpus N`` cell that asks for more GPUs than a GPU server has is refused
before anything is sent, in one short line with both numbers. Before, it said the count
twice: "http://… has 4 (4 GPUs (sm_90a))"."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from kcoral_shell import kcoral_shell

FOUR_FAKE_GPUS = ["--device", "fake-gpu", "--fake-gpu-count", "4", "--workers-per-gpu", "1"]


def test_more_gpus_than_a_gpu_server_has_are_refused_with_both_counts_said_once(
    server_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = server_factory(*FOUR_FAKE_GPUS)
    with kcoral_shell(server.url, monkeypatch, ()) as shell:
        with pytest.raises(UsageError) as refused:
            shell.run_cell_magic("kcoral", "--gpus 5", "x = 1\n")
    assert str(refused.value) == (
        f"%%kcoral: --gpus 5 needs a server with at least 5 GPUs; {server.url} has 4 GPUs (sm_90a)"
    )
