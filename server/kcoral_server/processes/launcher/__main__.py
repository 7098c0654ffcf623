"""``python -m kcoral_server.processes.launcher``: the fork server, or with ``--supervise``
a spawned worker's supervisor (``fork_server.main``)."""

from __future__ import annotations

import sys

from kcoral_server.processes.launcher.fork_server import main

sys.exit(main())
