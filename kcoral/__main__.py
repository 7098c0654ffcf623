"""``python -m kcoral`` is the ``kcoral`` command."""

from kcoral.cli import main

raise SystemExit(main())
