"""The ``%%kcoral`` and ``%kcoral`` magics, one module per command family.

``kcoral_magics`` registers the one IPython magic and hands each command to its family:
``cell`` (``%%kcoral``: run a cell), ``jobs`` (status, jobs, attach, cancel), ``server``
(connect, url, client, local, version) and ``sessions`` (``%kcoral session ...``).
``options`` declares every command's options once; ``%kcoral --help`` is rendered from it.
"""
