"""``python -m kcoral_server.worker --fd N``."""

from __future__ import annotations

import sys

from kcoral_server.worker.main import main

if __name__ == "__main__":
    sys.exit(main())
