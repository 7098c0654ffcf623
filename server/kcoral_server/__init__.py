"""The KCoral server: Tornado front-end, worker pool, GPU leases, caches and event log."""
