"""The routed endpoints beyond ``/execute``: ``/v1/info``, jobs, sessions and ``/metrics``
(EXTENSIONS §1, §5, §11; ROUTER §13)."""
