"""Variables a distributed launcher (torchrun and the like) sets for its own processes.

SERVER §6 step 2: a GPU worker must not inherit them, or a program's ``torch.distributed``
would join the launcher's job. Both the front-end (building a worker's environment) and the
worker runtime (before CUDA starts) drop them, so the list lives here once.
"""

from __future__ import annotations

RANK_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def is_rank_variable(name: str) -> bool:
    """Whether ``name`` belongs to a launcher (one of ``RANK_VARIABLES`` or ``TORCHELASTIC_*``)."""
    return name in RANK_VARIABLES or name.startswith("TORCHELASTIC_")
